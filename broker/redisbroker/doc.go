// Package redisbroker is the Redis implementation of broker.Broker.
//
// It takes a redis.UniversalClient, so a single node, Sentinel (failover
// client) and Redis Cluster all work, with go-redis's default options. Every
// state change is one Lua script (embedded from scripts/*.lua) that touches
// the keys of a single queue partition, all of which it declares, and all
// keys of a partition share one hash tag:
//
//	<prefix>:{<queue>:<p>}:t          hash: task ID -> compact record (internal/codec)
//	<prefix>:{<queue>:<p>}:pending    list of IDs (pushed left, popped right)
//	<prefix>:{<queue>:<p>}:active     zset: ID -> lease expiry (ms)
//	<prefix>:{<queue>:<p>}:scheduled  zset: ID -> due time (ms)
//	<prefix>:{<queue>:<p>}:retry      zset: ID -> retry time (ms)
//	<prefix>:{<queue>:<p>}:archived   zset: ID -> archive time (ms)
//	<prefix>:{<queue>:<p>}:completed  zset: ID -> expiry of retention (ms)
//	<prefix>:{<queue>:<p>}:result     hash: task ID -> result bytes
//	<prefix>:{<queue>:<p>}:u          hash: unique key -> "<expiry ms>:<task ID>"
//	<prefix>:{<queue>:<p>}:stat       hash: p:<day> / f:<day> -> processed / failed
//	<prefix>:{<queue>:<p>}:m          hash: p:<minute> / f:<minute> / q:<minute> -> processed, failed, pending (2 hours)
//	<prefix>:{<queue>:<p>}:h          hash: task ID -> attempt history (see hist_add in lib.lua)
//	<prefix>:{<queue>:<p>}:seq        the last fencing token handed out
//	<prefix>:{<queue>:<p>}:meta       the queue's layout (partition count)
//	<prefix>:{<queue>:<p>}:rq:<n>:<process>.<k>
//	                                  reply cache of slice n (an eighth of the replay window), the
//	                                  k-th fifty requests of one process (see below)
//	<prefix>:{<queue>:<p>}:rs:<n>:<process>.<k>
//	                                  reply slots of slice n: one byte a single Enqueue, the k-th fifty
//	                                  of one process (enqueue_one.lua)
//	<prefix>:{<queue>:<p>}:ik:<n>     idempotency keys used in window n → task ID
//	<prefix>:{<queue>:<p>}:paused     flag
//	<prefix>:{<queue>:<p>}:owner      the server maintaining the partition
//	<prefix>:{<queue>:<p>}:lim        hash: the partition's slots and settings of the queue's limits (see slots.lua, share.lua)
//	<prefix>:{<queue>:<p>}:starts     zset: token -> start time (ms) of the tasks started in the last broker.MaxRatePer
//	                                  (the newest broker.MaxQueueRate of them), with a rate or without
//	<prefix>:{<queue>:<p>}:forgot     zset: token -> start time (ms) of starts a rebalance forgot (the queue's
//	                                  oldest, in excess of its tokens), still counted against the tokens shared out
//	<prefix>:{<queue>:<p>}:gq         zset: "<group>\0<seq><id>" of every ready grouped task, in group and enqueue order
//	<prefix>:{<queue>:<p>}:gr         zset: the rotation: groups that may start a task, by when they joined
//	<prefix>:{<queue>:<p>}:gw         zset: group -> until when it is held back (throttled, over its rate) (ms)
//	<prefix>:{<queue>:<p>}:gs         hash: join number, cursor, sequence; per group its active tasks (kept
//	                                  only under a group limit), ordered holder and throttle
//	                                  (groups.lua's header has the fields)
//	<prefix>:{<queue>:<p>}:gid        hash: task ID -> "<group>\0<seq>" of every grouped task
//	<prefix>:{<queue>:<p>}:gl         hash: group -> its start times within the GroupRate window
//	<prefix>:{<queue>:<p>}:pg         hash: task ID -> progress "<percent>:<ms>:<note>"
//	<prefix>:{<queue>:<p>}:wt         hash: task ID -> expiry (ms) of the registration of those someone waits for (Wait)
//	<prefix>:{<queue>:<p>}:oc         hash: task ID -> how it ended, kept for Wait
//	<prefix>:{<queue>:<p>}:x          zset: task ID -> next look (ms) of the pointers in t (see Groups)
//	<prefix>:{<queue>:<p>}:xr         zset: claim nonce -> expiry (ms) of the fenced claims (see Groups)
//	<prefix>:{<queue>:<p>}:xl         hash: task ID -> nonce and score of a task leaving for a group of another partition (see Groups)
//	<prefix>:{<queue>:<p>}:ocx        zset: task ID -> when its outcome is forgotten
//	<prefix>:{<queue>:<p>}:events     stream: task lifecycle events, entries 0-1, 0-2, ... (see Events below)
//	<prefix>:queues                   set of known queue names
//	<prefix>:partitions               hash: queue -> partition count
//	<prefix>:limits                   hash: queue -> "<version>:<concurrency>:<rate>:<per ms>:..." (Admin.SetQueueLimits)
//	{<prefix>:limits}:bank:<queue>    hash: the slots of the queue's limits no partition holds (see Limits)
//	<prefix>:events                   hash: queue -> "1" or "0": whether it records task events (SetEvents)
//	<prefix>:{f:<id>}                 hash: a workflow's or batch's steps and counts (see flow.lua)
//	<prefix>:{f:<id>}:failed          list: task IDs of its steps that failed
//	<prefix>:{f:<id>}:names           list: its step names, in the order they were added
//	<prefix>:flows:w, :b              zset: workflow / batch ID -> creation time (ms), for listing
//
// All times are the Redis server's clock (TIME): a process whose own clock
// runs fast or slow neither starts a task before it is due nor misjudges a
// lease. The broker is a broker.Clock that tells Redis time, corrected for
// the offset of the local clock, so due times computed by clients match.
//
// # Partitions
//
// A task lives in partition broker.Partition(ID, P), so a lookup or Delete by
// ID goes straight to it. With P at least the number of cluster masters a
// single queue spreads over the whole cluster. A queue's partition count is
// recorded in Redis by the first process that uses it. A broker adopts the
// recorded count unless WithQueuePartitions names another one for that
// queue, in which case every call on the queue fails with an error wrapping
// broker.ErrLayout that names both counts. Every script checks the
// partition's layout key, so even a process that missed a change cannot
// run or lose a task it could not settle.
//
// # Re-sent requests
//
// go-redis sends a command again when its reply times out or the connection
// breaks after it was written, and Redis then runs it twice. Every state
// change therefore carries a random request ID; the script stores its reply
// in a reply cache of the partition (a hash that expires after the replay
// window) and a second run of the same request answers from it without
// changing anything. A reply cache holds the replies of at most fifty
// requests of one process, kept short (a run of "stored" codes as their
// count, a dequeue as its lease expiry and range of fencing tokens), so
// that Redis stores it as a compact list: about 20 bytes a request instead
// of about 60, and the caches' memory stays near (requests per second) ×
// window × 20 bytes. The broker itself sends a request whose outcome is
// unknown again, with the same ID, until it answers or the replay window is
// half gone; then the call fails with an error wrapping
// broker.ErrOutcomeUnknown. A task ID the broker chose is never drawn again
// unless the script proves that the task holding it is another one.
//
// A single Enqueue of a plain pending task (enqueue_one.lua) keeps its
// reply in reply slots instead: a string of one byte a request, the n-th
// fifty single enqueues of one process on the partition to a key, expiring
// like a reply cache. The request is named by its key and slot, which the
// broker hands out once each, rather than by a random ID, and claims its
// slot with one SETBIT, at the same cost however full the key is, where
// claiming an entry in a reply cache scans the hash; it keeps about a byte
// a request rather than 20.
//
// # Plain calls
//
// Redis turns every key and argument of a script call into a Lua string,
// and runs the definitions of the helpers a script carries, on every call.
// The commonest calls therefore have scripts of their own that take only
// what they use: a single pending task stored (enqueue_one.lua), plain
// tasks stored (enqueue_plain.lua), tasks leased in a partition without
// limits or groups (dequeue_plain.lua, 14 keys instead of 20) and plain
// tasks done and deleted (settle_plain.lua, 12 keys and 2 arguments a task
// instead of 26 and 9), in queues that record no events. The broker picks
// them by what it knows (the tasks' options, the queue's events setting);
// what only Redis knows (the partition's limits, groups and waiters, the
// record's unique key and followers) the plain script checks before it
// writes anything, and when it finds something it does not handle it
// changes nothing and the broker runs the general script with the same
// request ID (so a re-send of either answers from the one reply cache),
// then serves that partition with the general scripts for ten seconds.
// Either way Redis ends in the same state: a test runs the same steps
// through both and compares every key.
//
// # Limits
//
// A queue's Concurrency and Rate (Admin.SetQueueLimits) are the queue's, on
// any number of partitions: tasks waiting in one partition may run up to
// the whole limit. The dequeue script must check a limit in the same atomic
// step that leases, and a script sees one partition only (on Redis Cluster
// the partitions live on different nodes), so each limit is kept as slots:
// Concurrency C is C concurrency slots, Rate R per P is R rate tokens. Each
// slot is held by one node at a time: a partition (fields c and r of its
// limits hash <prefix>:{<queue>:<p>}:lim) or the queue's bank
// ({<prefix>:limits}:bank:<queue>, in the hash slot of the limits record).
// A partition starts a task only while its active tasks are fewer than the
// concurrency slots it holds (and than its cap ct, below), and while the
// starts in its last period are fewer than its tokens; a rate token is in
// use for one period after the start that used it.
//
// Slots move only by transfers, and a transfer is three steps (slots.lua),
// each one script on one node:
//
//   - give, on the source: take the slots off the node and write them, as
//     numbered parts for their destinations, into the node's one
//     outstanding record (field xo; a node with one gives nothing more).
//     Only slots no running task uses are given; rate tokens whose start is
//     still in the period go with the age of that start.
//   - apply, on each destination: add the part unless the destination has
//     applied a record of that source with that number or a later one
//     (field xi:<source>), and remember the number; a token's start is
//     entered with its age, so it stays in use for the rest of its period.
//   - clear, on the source: drop the record, once every destination has
//     applied it.
//
// Invariant: for each limit, the slots held by the nodes plus the parts of
// outstanding records not yet applied add up to the limit (the bank's
// count may be negative after a decrease, below), and no partition runs
// more tasks than the slots it holds (started more in the last period than
// its tokens). So the tasks running at once over all partitions are never
// more than the limit, at every moment, but for the tasks that were
// running when it was lowered. Proof sketch: give moves slots from the node into
// its record (the sum is unchanged) and takes only free slots, so the
// source still covers its running tasks; apply moves a part from the record
// into the destination, once: records of a source are numbered upwards and
// a new one is written only after the last was applied everywhere and
// cleared, so "applied here" is exactly "xi:<source> is at least this
// number", however often and by whomever the step is run, and a late or
// repeated apply adds nothing; a part whose destination was retired before
// it applied it (a retired partition applies nothing more, so its xi field
// is final) goes to the bank instead, fenced there the same way by a field
// of the source and the retired partition (xi:<source>><partition>), so it
// too counts once; clear drops only applied parts. A dequeue
// starts a task only into a free slot it holds. Each step is atomic, so a
// process that dies between steps leaves either slots in an outstanding
// record (held by no partition: nothing starts on them) or a record applied
// in part; any process completes it later (every rebalance first applies
// and clears the records it finds, and servers' maintenance asks for a
// rebalance every few seconds), and the fence makes that safe when the dead
// process's requests still arrive, or when several processes rebalance at
// once. No step reads two nodes, so it holds on Redis Cluster. For tokens
// the same argument counts uses: a token moves with the age of its last
// start, measured on the source's clock when given and entered on the
// destination's clock when applied, later, so a token is never used twice
// within a period of real time, whatever the offset between the nodes'
// clocks (their rates may differ by the usual fraction of a percent).
//
// A change of limit is one step on the bank together with the limits record
// (limits.lua): a raise adds the difference to the bank; a decrease puts the
// bank in debt: the partitions hold more slots than the limit, their
// running tasks may use them all, and a partition with a free slot could
// start one more. So the next rebalance holds every partition (a cap of 0,
// written whatever its slots became since they were read, before any
// transfer) and takes every free slot to the bank; until the debt is paid
// no partition starts a task, and each slot a task frees goes to the bank
// (a settle in a held partition wakes servers, whose dequeue asks for the
// rebalance; so does a recovered lease). Slots running tasks use are never
// taken: a partition that kept a free slot while another ran over its
// slots would start a task above the new limit. Once paid, the rebalance
// plans again and the holds give way to the usual caps. A limit switched
// on while tasks run is the same: their partitions hold no slots of the new
// era, so the bank's slots (and free ones) first go to cover them, and
// every partition is held while any running task is not covered. So after a
// decrease the tasks running at once go down to the new limit before any
// starts, and stay within it. Until that first rebalance, which
// SetQueueLimits runs before it returns, the old limit holds. A limit
// switched on begins a new era (the limits version): the bank holds the
// whole limit, each partition starts with no slots of that era, and parts of
// records of another era count for nothing; the starts such a part carries
// (ages of used tokens) are entered where it is applied all the same, as
// its source no longer counts them and a rate switched off and on again
// counts every start of its period. Slots recorded before the bank existed
// are era "0".
//
// Rebalancing (slots.go) follows the backlog. It reads every node, takes
// each partition's demand (running plus waiting tasks for Concurrency,
// waiting tasks for Rate, no more than its concurrency share leaves room
// to start; the ready tasks of groups that may not start one now, all of
// them held until a time or blocked by their limits, are not waiting:
// counted, they kept slots idle beside their partition while another's
// tasks waited), shares the limit out max-min fairly (a partition
// gets its demand, or the level that shares the limit when demands exceed
// it; spare slots are spread evenly), and moves slots from the bank and
// from partitions above their share to those below. For Rate, each
// partition first keeps the tokens its starts in the period use, and only
// the free rest is shared by demand: a partition may hold more starts in
// the period than tokens (a rate switched on or lengthened counts the
// starts made before; a token that pays a lowered limit's debt leaves its
// start where it was made), and a token free elsewhere would then be used
// twice in a period (the starts of partitions a rate switched on has not
// reached yet count too). When the partitions' starts in the period are more
// than the limit, no token is free, and the rebalance forgets the excess
// starts, the oldest of the whole queue: nothing starts until a start in
// the period leaves it, and by then the forgotten ones, older than every
// start counted, have left too; so no partition holds fewer tokens than
// starts, and the starts of any period over all partitions stay within the
// limit. Forgetting leaves no partition room it had not: the oldest starts
// may be where tokens back every start (the excess is elsewhere, or a
// lowered limit's debt is not paid yet), and the tokens they free there go
// to the bank in the same step, as a transfer the rebalance completes
// before it plans (a lease between the forget and the plan started tasks
// over the limit before). A forgotten start is a real start all the same:
// it moves to the partition's forgotten starts (key forgot), and while it
// is in the period the rebalance leaves that many tokens in the bank, so a
// limit raised meanwhile adds only the tokens they leave free (before, the
// forgotten starts counted nowhere and a raise let as many tasks start
// over the new limit). The excess is counted over several partitions, so one rebalance at
// a time forgets (a lock, field fl of the bank), counting the starts again
// under the lock: two that forgot from the same counts would forget it
// twice, starts that back tokens. A Rate changed to a shorter period (13
// per 3 s to 6 per 2 s) leaves the partitions the old limit's tokens until
// the rebalance takes them back, and those counted over the shorter period
// would start more than either rate allows in its own period. So a
// partition keeps counting over the longer period (field per; the shorter
// one waits in pn) until a rebalance finds the bank holding all it needs,
// which means the partitions hold no more than the new limit, and lets it
// in (slots.lua "period"); a partition new to the rate in a repartition
// counts over the longest period the queue's partitions count, as it may
// be given tokens of the old limit. While demands exceed
// the limit, each partition gets a cap (ct) at its share, so that one that
// holds more stops reusing the slots its tasks free and gives them away.
// The caps are hints: a stale one can slow the flow of slots, never exceed a
// limit. A cap is written only if the partition's slots and cap are still
// as the plan read them (after its own give in the same plan); one refused
// because another rebalance changed them meanwhile makes the rebalance
// plan again (twice at most), as a stale cap and fair-share flag can leave
// a freed slot unannounced while the partition where tasks wait does not
// ask. A dequeue that starts nothing for want of slots while tasks wait
// (unless the partition has its fair share: fields cs, rs; for rs only
// until ru, the moment the first token in use anywhere becomes free, maybe
// where no task wants it, which a refused dequeue also announces to the
// servers), or that finds free slots over its cap, or a free slot under
// its cap with nothing to run (also when it has no free rate token: the
// slot would idle there), asks its process for a
// rebalance, which runs in
// the background, at most one per queue and process at a time and every
// 20ms; a settlement that frees slots over a cap wakes servers to find
// them; a partition that gets slots while tasks wait wakes servers too.
// One busy partition among idle ones takes the whole limit in one
// rebalance, milliseconds after its first refused dequeue.
//
// A repartition keeps the invariant with the same transfers: the new
// partitions start with no slots; the old ones get a cap of 0 (under a
// Concurrency), so they start nothing more and give their slots to the new
// ones as their tasks finish (under a Rate alone their tokens go as the new
// partitions want them; those its starts in the period use stay until
// then); before an old partition is retired it gives away all it holds
// (tokens in use with their ages), and its other starts move with their
// ages to a new partition, so that a rate set later counts them. No
// rebalance plans tokens for an old partition: its starts count against
// the tokens the current span shares, backed or not. Other processes'
// rebalances move tokens meanwhile (a concurrency slot to cover a task
// the old partition ran, or a transfer still outstanding, may reach it
// after a read): the release reads again, with a growing pause after
// another's move, until a read finds the partition holding nothing, and
// drops each page of starts there only after the new partition has them
// and only while the partition holds nothing; the step that retires the
// partition refuses while it holds a slot, a token or a transfer, and the
// release runs again. Tokens a retired partition held would be lost to
// the queue. A transfer given to it after the release's last look (a plan
// read while it still ran a task no slot covered) and arriving once it is
// retired goes to the bank instead: the retired partition's limits hash,
// kept a day after the repartition finishes, records which transfers it
// applied, so the bank counts each such part once however often it is
// tried. The limits hold over both sets of partitions together
// throughout, and any limit fits any partition count.
//
// Starts are recorded with a rate or without, for the longest period a rate
// may have (broker.MaxRatePer; at most the newest broker.MaxQueueRate of
// them, as no rate counts more), so that a rate set or changed later counts
// the starts made in its period before the change; a rate token counts as
// used while the start that used it is in the rate's period. That costs
// about 120 bytes of Redis memory a start kept: up to about 12 MB for a
// partition that starts more than MaxQueueRate tasks a week.
//
// # Groups
//
// All tasks of a group live in partition broker.Partition(group, P). An ID
// the broker draws for a grouped task carries the group as its hash tag
// ("<random>{<group>}"), so that the task is found by its ID there whatever
// P is. An ID the caller chose may not (broker.FreeGroupID): on several
// partitions, when its partition I is not the group's G, a pointer in I's
// records hash (field: the ID; listed in I's pointers zset x) leads
// lookups by ID to G. An enqueue claims the pointer in I, stores the task
// in G and confirms the pointer; a claim nobody finished is fenced in G
// (G's fences zset xr: a store of a fenced claim is refused) and then
// confirmed or released by the maintainer of I, or by the next enqueue of
// the ID; a pointer whose task is gone is released by that maintainer
// (ids.lua, freeids.go and docs/design.md have the protocol). Replace into
// a group of another partition moves the task: a move's claim in I names
// both groups, the task leaves its old partition (flagged as moving, listed
// in its leaving hash xl), is stored in the new one and deleted from the
// old one (relocate.lua); a move nobody finished is finished or undone by
// the maintainer of I or of the old partition. Leases carry
// the group, so renewals and settlements go to G directly. A repartition
// first sets field xf of every partition's group state hash, from when on
// enqueue.lua refuses new grouped tasks with untagged IDs there (an
// enqueue waits for the new layout and is sent again), settles the claims
// outstanding, and moves such tasks with their groups, writing
// their pointers in the new span before they arrive. The group's partition keeps
// its groups' ready tasks in enqueue order and a rotation of the groups that
// may run; the dequeue script serves the rotation one task per group per
// turn and checks the group limits (which are not split: a group is in one
// partition) in the same step. A group that may not start a task leaves
// the rotation (at the start that blocks it: an Ordered group's one task,
// its GroupRate used up; at its GroupConcurrency, at the next turn that
// finds it there) and a task made ready does not bring it back while it is
// blocked; the settle, removal or time that lets it go puts it back and
// wakes idle servers. So a dequeue looks at a blocked group at most once
// each time it blocks, however many groups are blocked and however many
// tasks wait in them. A partition without grouped tasks takes the plain
// path: one EXISTS more than before.
//
// A repartition keeps what it promised to groups. While it runs, grouped
// tasks start in neither set of partitions (ungrouped ones go on): a group
// may have tasks in both, and a task still running in an old partition may
// yet throttle its group there. A moved task keeps its enqueue sequence, and
// a new set of partitions numbers its tasks above every older one (epoch e
// from e × 2^40), so an ordered group runs in the order of enqueue, not of
// the move, also for tasks enqueued while the move runs. When an old
// partition holds nothing more, its groups' rate windows and throttles are
// copied to their new partitions; only then, once every old partition is
// retired, do grouped tasks start again. The hold is part of each
// partition's settings, which SetQueueLimits gives for the layout it read:
// it reads the layout again after giving them and gives them anew when a
// repartition started or ended meanwhile (the repartition may have given
// its own of the same limits first), so that no partition keeps the hold
// of a repartition that is over. While old partitions retire, the admin
// calls take a retired one for what it is, an empty part of the same
// layout.
//
// When a settlement or a lease recovery gives room back to a partition that
// was full and has tasks waiting (ungrouped, or grouped ones of a group that
// may run), the script publishes a pending event, so idle servers look
// again at once. A dequeue refused by the rate limit while tasks
// wait publishes, once per instant, a pending event that says when room
// opens; servers look again then.
//
// Work events are published on <prefix>:ev:<queue> from inside the scripts.
//
// # Events
//
// A queue that records task events (Broker.SetEvents, tide.Inspector.
// SetQueueEvents; off by default, or on for every queue without a setting
// with WithEvents(true)) has each state change appended, by the script that
// makes it, to its partition's stream: one entry per script run holding
// its events (up to 64: enqueued, started, succeeded, failed, retrying,
// archived, deleted, cancelled; task ID, type and error, never a payload).
// Entries are numbered 0-1, 0-2, ... (XADD 0-*, which needs Redis 7.0), so
// that a reader notices entries trimmed before it read them. Each stream
// is kept to about WithEventRetention's entries (default 10,000, XADD
// MAXLEN ~) and age (default 24 hours, trimmed when the partition is
// maintained). Recording costs each script run that changes tasks one
// XADD: measured at about a tenth to a quarter more of Redis's time for
// small tasks, which is why it is opt-in per queue; a queue that records
// nothing costs nothing. Broker.ReadEvents reads the streams (XREAD BLOCK)
// and hands out resume tokens that hold the position in each of them.
package redisbroker

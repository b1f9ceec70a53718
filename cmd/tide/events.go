package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidequeue/tide"
	"github.com/tidequeue/tide/broker"
	"github.com/tidequeue/tide/gateway"
)

// eventsCostHelp is the paragraph of the help texts on what recording
// events costs and who sees a change.
const eventsCostHelp = `Queues record no task events until turned on: recording costs every state
change one more write to Redis (about a tenth to a quarter more of Redis's
time for small tasks). The setting is kept in Redis for every process:
servers see a change at once, other processes (producers enqueueing tasks)
within half a minute, so the first 'enqueued' events may be missing for
that long.`

func eventsSwitch(on bool) *command {
	verb, summary, help := "on", "start recording the task events of queues", `
Turn the recording of task events on for each queue: from then on every
step of its tasks' lives (enqueued, started, succeeded, failed, retrying,
archived, deleted, cancelled) is recorded, in the same atomic step as the
change it reports, for 'tide events tail', Inspector.Events and the
gateway's GET /v1/events. Events are kept for about 10,000 entries per
partition and 24 hours (redisbroker.WithEventRetention).

`+eventsCostHelp+`

A queue that never had a task is refused (exit 3, with the list of queues),
as 'tide pause' does: the name is most likely a typo. --force turns its
events on anyway, e.g. to record a new queue's first tasks; it is still not
listed by 'tide queues' until its first task. Nothing is changed unless
every queue given is accepted.

Examples:
  tide events on orders
  tide events on orders emails
  tide events on reports-v2 --force   # before its first task`
	if !on {
		verb, summary, help = "off", "stop recording the task events of queues", `
Turn the recording of task events off for each queue (see 'tide events on
--help'): its state changes record no more events, which saves their cost.
Events already recorded are kept until trimmed (by length and age), and
readers following only these queues see no new events.

A queue that never had a task is refused (exit 3), as 'tide unpause' does;
--force turns its events off anyway. Nothing is changed unless every queue
given is accepted.

Examples:
  tide events off orders
  tide events off orders emails --json`
	}
	return &command{
		name: "events " + verb, args: "<queue>... [--force]", minArgs: 1, maxArgs: -1, redis: true,
		summary: summary,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			fs.BoolVar(&o.force, "force", false, "turn "+verb+" the events of a queue that never had a task")
		},
		help: help,
		check: func(_ *app, o *cmdOpts, args []string) error {
			for _, q := range args {
				if err := checkQueueArg(o.cmd, q); err != nil {
					return err
				}
			}
			return nil
		},
		run: func(ctx context.Context, a *app, o *cmdOpts, args []string) error {
			return a.setEvents(ctx, args, on, o.force)
		},
	}
}

var (
	cmdEventsOn  = eventsSwitch(true)
	cmdEventsOff = eventsSwitch(false)
)

// eventsSwitchJSON is a queue in the --json output of 'events on' and
// 'events off'.
type eventsSwitchJSON struct {
	Queue  string `json:"queue"`
	Events bool   `json:"events"`
}

// setEvents turns the events of queues on or off. Every queue is checked
// first, as 'pause' checks its queue, so that a typo changes nothing.
func (a *app) setEvents(ctx context.Context, queues []string, on, force bool) error {
	verb := "on"
	if !on {
		verb = "off"
	}
	queues = uniq(queues)
	for _, q := range queues {
		err := a.knownQueue(ctx, q)
		var nf *notFoundError
		switch {
		case err == nil:
		case !errors.As(err, &nf):
			return err
		case force:
			a.note("%s; turning its events %s anyway (--force)", err.Error(), verb)
		case on:
			return &notFoundError{msg: fmt.Sprintf("%v\n  Check the name; to record the events of a queue before its first task, add --force.", err)}
		default:
			return &notFoundError{msg: fmt.Sprintf("%v\n  Check the name (--force turns its events off anyway).", err)}
		}
	}
	out := make([]eventsSwitchJSON, 0, len(queues))
	for _, q := range queues {
		if err := a.in.SetQueueEvents(ctx, q, on); err != nil {
			done := ""
			if len(out) > 0 {
				done = fmt.Sprintf(" (done for %s)", strings.Join(switchedQueues(out), ", "))
			}
			return fmt.Errorf("tide: turn events of %s %s%s: %w", q, verb, done, err)
		}
		out = append(out, eventsSwitchJSON{q, on})
	}
	if a.globals.json {
		return a.printJSON(out)
	}
	for _, q := range queues {
		if on {
			fmt.Fprintf(a.stdout, "Queue %s records task events now ('tide events tail %s' follows them).\n", q, q)
		} else {
			fmt.Fprintf(a.stdout, "Queue %s records no task events now.\n", q)
		}
	}
	return nil
}

func switchedQueues(s []eventsSwitchJSON) []string {
	qs := make([]string, len(s))
	for i, x := range s {
		qs[i] = x.Queue
	}
	return qs
}

// uniq returns the strings of s in order, each once.
func uniq(s []string) []string {
	var out []string
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

var cmdEventsTail = &command{
	name: "events tail", args: "<queue>... [--after ID | --oldest] [--count N] [--timeout D]", minArgs: 0, maxArgs: -1, redis: true,
	summary: "print the task events of queues as they come",
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		fs.Func("after", "start right after the event with this `ID` (printed by --json and at the end), with no gap and no repeat", func(v string) error {
			o.after, o.afterSet = v, true
			return nil
		})
		fs.BoolVar(&o.oldest, "oldest", false, "start with the oldest event still kept (default: from now)")
		fs.IntVar(&o.count, "count", 0, "stop after `N` events (0: no limit)")
		fs.Var(&o.timeout, "timeout", "stop after this long, e.g. `10m` (default: no limit)")
	},
	help: `
Print the task events of the queues as they are recorded, one line each: the
time the broker recorded it (UTC, milliseconds), the queue, what happened
(enqueued, started, succeeded, failed, retrying, archived, deleted,
cancelled), the task ID and type, and for failed, retrying and archived the
error. With --json each event is one JSON object on its own line, as the
gateway's GET /v1/events sends them: "id" (the event's ID, its resume
token), "queue", "task_id", "type", "kind", "at" and "error".

It starts from now, with --oldest from the oldest event kept, or with
--after right after the event with that ID: it then prints exactly the
events that followed it, with no gap and no repeat. With --after the queues
may be left out (the ID names them); given, they must be the same. Events
come at least once, in order for each task (and each partition of a
queue); events of different queues or partitions may interleave.

At the end it prints to stderr the ID of the last event printed
({"note": ..., "last_id": ...} with --json), to go on later with --after.

Exit codes:
  0  --count events were printed, --timeout passed, or Ctrl-C
  1  the events after --after were already trimmed (events are kept for a
     bounded length and age: about 10,000 entries per partition and 24
     hours): start again with --oldest, or from now; or none of the queues
     records events: turn them on with 'tide events on'
  2  --after is not the ID of an event (malformed, altered, or of other
     queues), or another usage error
  3  a queue that records no events never had a task (a typo?)

` + escapeHelp + `

Examples:
  tide events tail orders
  tide events tail orders emails --oldest --count 100
  tide events tail orders --json > events.ndjson
  tide events tail orders --json --after e1AQZvcmRlcnMB...   # go on where it stopped
  tide events tail orders --json | jq -r 'select(.kind == "failed") | [.task_id, .error] | @tsv'`,
	check: func(_ *app, o *cmdOpts, args []string) error {
		for _, q := range args {
			if err := checkQueueArg(o.cmd, q); err != nil {
				return err
			}
		}
		switch {
		case o.afterSet && o.oldest:
			return usagef(o.cmd, "give either --after or --oldest, not both")
		case o.afterSet && o.after == "":
			return usagef(o.cmd, "--after is empty: give the ID of an event, or leave --after out to start from now")
		case o.count < 0:
			return usagef(o.cmd, "--count %d is negative", o.count)
		}
		if o.afterSet && o.after != tide.EventsOldest {
			ps, err := broker.DecodeEventToken(o.after)
			if err == nil {
				_, err = broker.CheckTokenQueues(args, ps)
			}
			if err != nil {
				return usagef(o.cmd, "--after: %s", strings.TrimPrefix(err.Error(), "tide: "))
			}
			return nil
		}
		if len(args) == 0 {
			return usagef(o.cmd, "give the queues to follow (or --after ID to go on after an event): tide %s %s", o.cmd.name, o.cmd.args)
		}
		return nil
	},
	run: runEventsTail,
}

// eventTimeFormat is the time of an event in 'events tail': UTC, with the
// broker's millisecond precision.
const eventTimeFormat = "2006-01-02T15:04:05.000Z"

// eventLine is an event as 'events tail' prints it. Every stored string is
// escaped, and kept on the line as a table cell is.
func eventLine(ev tide.TaskEvent) string {
	cell := func(s string) string { return escape(cellLayout.Replace(s)) }
	line := fmt.Sprintf("%s  %s  %-9s  %s  %s", ev.At.UTC().Format(eventTimeFormat), cell(ev.Queue), ev.Kind, cell(ev.TaskID), cell(orDash(ev.Type)))
	if ev.Err != "" {
		line += "  " + cell(ev.Err)
	}
	return line
}

func runEventsTail(ctx context.Context, a *app, o *cmdOpts, args []string) error {
	queues := uniq(args)
	from := tide.EventsFrom{Queues: queues}
	switch {
	case o.oldest:
		from.After = tide.EventsOldest
	case o.afterSet:
		from.After = o.after
		if len(queues) == 0 {
			ps, _ := broker.DecodeEventToken(o.after) // checked
			queues = broker.TokenQueues(ps)
		}
	}
	ectx, cancel := context.WithCancel(ctx)
	if o.timeout > 0 {
		ectx, cancel = context.WithTimeout(ctx, time.Duration(o.timeout))
	}
	defer cancel()
	ch, err := a.in.Events(ectx, from)
	if err != nil {
		return a.eventsErr(ctx, o.cmd, queues, err)
	}
	start := "from now"
	switch {
	case o.oldest:
		start = "from the oldest kept"
	case o.afterSet:
		start = "after the given event"
	}
	what := "queue"
	if len(queues) > 1 {
		what = "queues"
	}
	a.status(nil, "following the task events of %s %s %s; Ctrl-C to stop", what, strings.Join(queues, ", "), start)

	last := ""
	if o.afterSet && o.after != tide.EventsOldest {
		last = o.after
	}
	n, closed := 0, true
	var werr error
	for ev := range ch {
		if a.globals.json {
			werr = writeLineJSON(a.stdout, gateway.Event{ID: ev.ID, Queue: ev.Queue, TaskID: ev.TaskID, Type: ev.Type,
				Kind: ev.Kind.String(), At: ev.At.UTC(), Error: ev.Err})
		} else {
			_, werr = fmt.Fprintln(a.stdout, eventLine(ev))
		}
		if werr != nil {
			closed = false
			break
		}
		last = ev.ID
		n++
		if o.count > 0 && n >= o.count {
			closed = false
			break
		}
	}
	// The channel closed on its own only when the reading ended: ectx
	// (Ctrl-C, --timeout) or unread events trimmed.
	early := closed && ectx.Err() == nil
	cancel()
	for range ch { // until its goroutines have returned
	}
	if last != "" {
		a.status(map[string]string{"last_id": last}, "last event ID %s; go on after it with: tide events tail %s --after %s", last, strings.Join(queues, " "), last)
	} else {
		a.status(nil, "no events")
	}
	switch {
	case werr != nil:
		return fmt.Errorf("tide: write event: %w", werr)
	case early:
		return fmt.Errorf("tide: the reading of events ended: events not yet printed were trimmed before they were read (they are kept for a bounded length and age, and this reader fell behind)\n  Go on with --oldest (events between are lost), or from now without --after")
	}
	return nil
}

// eventsErr words an error of Inspector.Events.
func (a *app) eventsErr(ctx context.Context, cmd *command, queues []string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "tide: ")
	switch {
	case errors.Is(err, tide.ErrBadEventToken):
		return usagef(cmd, "--after: %s", msg)
	case errors.Is(err, tide.ErrEventGap):
		return fmt.Errorf("tide: %s\n  The events that followed --after's event were trimmed before they were read, and are lost: start again from the oldest kept with 'tide events tail %s --oldest', or from now without --after", msg, strings.Join(queues, " "))
	case errors.Is(err, tide.ErrEventsOff):
		// A queue that records nothing because it does not exist is
		// most likely a typo: say so, as 'pause' does.
		for _, q := range queues {
			var nf *notFoundError
			if kerr := a.knownQueue(ctx, q); errors.As(kerr, &nf) {
				return &notFoundError{msg: fmt.Sprintf("%v, and it records no task events\n  Check the name; to record the events of a queue before its first task: tide events on %s --force", kerr, q)}
			}
		}
		what := "queue " + queues[0] + " records no"
		if len(queues) > 1 {
			what = "none of the queues " + strings.Join(queues, ", ") + " records"
		}
		return fmt.Errorf("tide: %s task events (they are off by default)\n  Turn them on with: tide events on %s\n  (recording costs throughput; see 'tide events on --help'). Only the events recorded from then on can be read", what, strings.Join(queues, " "))
	case errors.Is(err, tide.ErrInvalidTask):
		return usagef(cmd, "%s", strings.TrimPrefix(err.Error(), tide.ErrInvalidTask.Error()+": "))
	}
	return fmt.Errorf("tide: read events of %s: %s", strings.Join(queues, ", "), msg)
}

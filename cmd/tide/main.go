// Command tide inspects and operates tide queues on Redis, serves the web
// dashboard, and runs the HTTP gateway (with the webhook sender) for
// applications in other languages. Run `tide --help` for the commands, and
// `tide <command> --help` for each one.
//
// Exit codes: 0 success, 1 the operation failed (Redis unreachable, a task
// in the wrong state, ...), 2 usage error (bad flags or arguments), 3 the
// task, queue, workflow or batch was not found, 4 the task waited for
// ('tasks wait') failed: it was archived, 5 the wait timed out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/tidequeue/tide"
)

// Exit codes, documented in `tide --help`.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNotFound = 3
	exitArchived = 4 // tasks wait: the task was archived
	exitTimeout  = 5 // tasks wait: --timeout passed first
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a bad command line; it exits with exitUsage.
type usageError struct {
	msg string
	cmd *command // whose help to point to; nil for the top level
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *command, format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...), cmd: cmd}
}

// notFoundError is a missing task or queue; it exits with exitNotFound.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

// codedError is a failure with an exit code of its own (exitArchived,
// exitTimeout).
type codedError struct {
	code int
	msg  string
}

func (e *codedError) Error() string { return e.msg }

// run is the whole program: it parses args, runs the command and returns the
// exit code. ctx ends long-running commands (watch, dash, serve); env reads
// the environment.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	// go-redis logs to the process's stderr on its own, e.g. a line per
	// failed dial, many a second while Redis is down: route it to this
	// run's logger at debug level instead (see redisLogger).
	redis.SetLogger(redisLogger{})
	a := &app{env: env, stdout: stdout, stderr: stderr, jsonArg: wantsJSON(args)}
	defer a.close()
	err := a.dispatch(ctx, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	code, msg, hint := exitError, err.Error(), ""
	var ue *usageError
	var nf *notFoundError
	var ce *codedError
	switch {
	case errors.As(err, &ue):
		code, msg, hint = exitUsage, ue.msg, "Run 'tide --help' for usage."
		if ue.cmd != nil {
			hint = fmt.Sprintf("Run 'tide %s --help' for usage.", ue.cmd.name)
		}
	case errors.As(err, &nf) || errors.Is(err, tide.ErrTaskNotFound) || errors.Is(err, tide.ErrWorkflowNotFound):
		code = exitNotFound
	case errors.As(err, &ce):
		code = ce.code
	}
	msg = strings.TrimPrefix(msg, "tide: ")
	if a.jsonErrors() {
		// Exact, like the rest of --json, and escaped (see writeJSON).
		_ = writeLineJSON(stderr, struct {
			Error string `json:"error"`
			Code  int    `json:"code"`
		}{msg, code})
		return code
	}
	// Error messages quote names and errors read from Redis: escape them.
	fmt.Fprintln(stderr, "tide: "+escapeLines(msg))
	if hint != "" {
		fmt.Fprintln(stderr, hint)
	}
	return code
}

// wantsJSON reports whether args ask for --json before any "--", so that
// an error found before the flags are parsed is reported as JSON too.
func wantsJSON(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true", "--json=1", "-json=1":
			return true
		}
	}
	return false
}

// flagError rewords the flag package's errors, which name flags with one
// dash ("flag provided but not defined: -bogus"), with the two dashes the
// help shows.
func flagError(err error) string {
	msg := err.Error()
	for _, r := range flagMessages {
		if r.re.MatchString(msg) {
			return r.re.ReplaceAllString(msg, r.repl)
		}
	}
	return msg
}

var flagMessages = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`^flag provided but not defined: -+(.*)$`), "unknown flag --$1"},
	{regexp.MustCompile(`^flag needs an argument: -+(.*)$`), "--$1 needs a value"},
	{regexp.MustCompile(`(?s)^invalid boolean value (".*") for -+([^:]*): .*$`), "--$2 is true or false, not $1"},
	{regexp.MustCompile(`(?s)^invalid boolean flag -*([^:]*): (.*)$`), "--$1: $2"},
	{regexp.MustCompile(`(?s)^invalid value (".*") for flag -+([^:]*): (.*)$`), "--$2 $1: $3"},
	{regexp.MustCompile(`^bad flag syntax: (.*)$`), "bad flag syntax: $1 (flags look like --name or --name=value)"},
}

// command is one (sub)command.
type command struct {
	name    string // "tasks ls"
	args    string // "<queue> [flags]"
	summary string
	help    string // description and examples
	// flags registers the command's own flags.
	flags func(fs *flag.FlagSet, o *cmdOpts)
	// nargs is the number of positional arguments, min and max (-1: any).
	minArgs, maxArgs int
	// check, when set, validates flags and arguments before connecting.
	check func(a *app, o *cmdOpts, args []string) error
	// redis: the command needs a connection.
	redis bool
	// taskData: the command reads or writes payloads and results, so it
	// takes --encryption-keys (TIDE_ENCRYPTION_KEYS).
	taskData bool
	run      func(ctx context.Context, a *app, o *cmdOpts, args []string) error
}

// cmdOpts holds every command flag; each command registers the ones it uses.
type cmdOpts struct {
	cmd         *command // the command being run
	state       string
	page, size  int
	all         bool
	force       bool
	pauseFor    durationFlag
	watch       bool
	interval    durationFlag
	count       int
	addr        string
	token       string
	title       string
	tokens      listFlag
	maxBody     int64
	allowQueues listFlag
	whSecret    string
	whAllow     listFlag
	whQueue     string
	whConc      int
	whTimeout   durationFlag
	whPrivate   bool
	encKeys     string
	allowHosts  listFlag
	readToken   string
	filter      tide.TaskFilter // tasks ls --id, --type, --payload, --error
	histDSN     string          // --history-dsn
	histTable   string          // --history-table
	lim         limitsOpts      // limits set
	offset      int             // workflows ls, batches ls
	limit       int             // workflows ls, batches ls
	timeout     durationFlag    // tasks wait, events tail
	after       string          // events tail --after
	afterSet    bool            // --after was given
	oldest      bool            // events tail --oldest
}

var commands []*command

// flagSet returns a flag set with the command's own flags bound to o.
func (c *command) flagSet(o *cmdOpts) *flag.FlagSet {
	fs := flag.NewFlagSet("tide "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.flags != nil {
		c.flags(fs, o)
	}
	if c.taskData {
		fs.StringVar(&o.encKeys, "encryption-keys", "", "`keys` that encrypt payloads and results, \"ID:BASE64SECRET,...\" as encrypt.ParseKeys reads them (default $TIDE_ENCRYPTION_KEYS)")
	}
	return fs
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// groups are commands that take a subcommand.
var groups = map[string]string{
	"queues":    "list and change queues",
	"tasks":     "inspect and act on the tasks of a queue",
	"cron":      "inspect periodic tasks",
	"limits":    "show and change a queue's flow-control limits",
	"workflows": "inspect and cancel workflows, DAGs of tasks",
	"batches":   "inspect and cancel batches of tasks",
	"events":    "record task events and follow them",
}

// groupDefaults are the subcommands a group runs when none is given.
var groupDefaults = map[string]string{"queues": "ls", "limits": "get", "workflows": "ls", "batches": "ls"}

// dispatch parses the global flags, finds the command and runs it.
func (a *app) dispatch(ctx context.Context, args []string) error {
	top := flag.NewFlagSet("tide", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	a.globals.defaults(a.env)
	a.globals.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			a.topHelp(a.stdout)
			return flag.ErrHelp
		}
		return usagef(nil, "%s", flagError(err))
	}
	rest := top.Args()
	if len(rest) == 0 {
		if !a.jsonErrors() {
			a.topHelp(a.stderr)
		}
		return usagef(nil, "no command given")
	}
	name := rest[0]
	rest = rest[1:]
	if name == "help" {
		return a.help(rest)
	}
	if _, ok := groups[name]; ok {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
				a.groupHelp(a.stdout, name)
				return flag.ErrHelp
			}
			if def, ok := groupDefaults[name]; ok {
				rest = append([]string{def}, rest...)
			} else {
				if !a.jsonErrors() {
					a.groupHelp(a.stderr, name)
				}
				return usagef(nil, "'%s' needs a subcommand", name)
			}
		} else if def, ok := groupDefaults[name]; ok && findCommand(name+" "+rest[0]) == nil && findCommand(aliases[name+" "+rest[0]]) == nil {
			rest = append([]string{def}, rest...) // arguments of the default subcommand
		}
		name += " " + rest[0]
		rest = rest[1:]
	}
	cmd := findCommand(name)
	if cmd == nil {
		if c := findCommand(aliases[name]); c != nil {
			cmd = c
		} else {
			return usagef(nil, "unknown command %q", name)
		}
	}
	o := cmdOpts{cmd: cmd}
	fs := cmd.flagSet(&o)
	a.globals.register(fs) // global flags may come after the command too
	pos, err := parseInterleaved(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			a.commandHelp(a.stdout, cmd)
			return flag.ErrHelp
		}
		return usagef(cmd, "%s", flagError(err))
	}
	a.parsed = true
	if err := a.globals.check(); err != nil {
		return usagef(cmd, "%s", err)
	}
	if err := a.setLogLevel(cmd); err != nil {
		return err
	}
	if len(pos) < cmd.minArgs || cmd.maxArgs >= 0 && len(pos) > cmd.maxArgs {
		return usagef(cmd, "usage: tide %s %s", cmd.name, cmd.args)
	}
	if cmd.check != nil {
		if err := cmd.check(a, &o, pos); err != nil {
			return err
		}
	}
	if cmd.taskData {
		if err := a.encryptionKeys(&o); err != nil {
			return err
		}
	}
	if cmd.redis {
		if err := a.connect(ctx); err != nil {
			return err
		}
	}
	return cmd.run(ctx, a, &o, pos)
}

var aliases = map[string]string{
	"tasks list":     "tasks ls",
	"tasks get":      "tasks show",
	"tasks rm":       "tasks delete",
	"cron list":      "cron ls",
	"queue":          "queues ls",
	"queues list":    "queues ls",
	"server":         "servers",
	"dashboard":      "dash",
	"gateway":        "serve",
	"tasks remove":   "tasks delete",
	"queues delete":  "queues rm",
	"queues remove":  "queues rm",
	"limits show":    "limits get",
	"workflows list": "workflows ls",
	"workflows get":  "workflows show",
	"batches list":   "batches ls",
	"batches get":    "batches show",
}

func (a *app) help(args []string) error {
	if len(args) == 0 {
		a.topHelp(a.stdout)
		return nil
	}
	name := strings.Join(args, " ")
	if _, ok := groups[name]; ok {
		a.groupHelp(a.stdout, name)
		return nil
	}
	cmd := findCommand(name)
	if cmd == nil {
		cmd = findCommand(aliases[name])
	}
	if cmd == nil {
		return usagef(nil, "no help for unknown command %q", name)
	}
	a.commandHelp(a.stdout, cmd)
	return nil
}

const topHelpText = `tide inspects and operates tide task queues on Redis, and serves the web
dashboard and the HTTP gateway.

Usage:
  tide [global flags] <command> [arguments] [flags]

Commands:
%s
Global flags (also accepted after the command):
  --redis ADDR        Redis address, host:port or redis://[user:password@]host:port/db
                      (rediss:// for TLS). Default $TIDE_REDIS_ADDR, else 127.0.0.1:6379.
  --prefix P          key prefix your servers use (redisbroker.WithPrefix).
                      Default $TIDE_PREFIX, else "tide".
  --partitions N      partitions of queues not yet recorded in Redis (redisbroker.WithPartitions);
                      queues in use keep the count recorded for them. Default 1.
  --json              print JSON instead of tables, for scripts; errors are then
                      printed to stderr as {"error": "...", "code": N}, notes and
                      warnings as {"note": "..."} and {"warning": "..."}, and logs
                      as JSON lines.

Exit codes:
  0  success
  1  the operation failed (Redis unreachable, task in the wrong state, ...)
  2  usage error (unknown command, bad flag or argument)
  3  the task, queue, workflow or batch was not found (pause, unpause,
     limits set, events on and off, and queues rm: the queue never had a
     task; pause, unpause, limits set and events on and off --force act
     anyway)
  4  tasks wait: the task failed (it was archived)
  5  tasks wait: --timeout passed before the task finished

Examples:
  tide queues                                   # every queue, its sizes and today's counts
  tide tasks ls orders --state retry            # tasks waiting to be retried
  tide tasks show orders order-cancel:42        # one task, with payload, attempts and last error
  tide tasks ls orders --state archived --error timeout   # search by ID, type, payload or error
  tide tasks run orders --all --state archived  # retry every archived task now
  tide --redis 10.0.0.5:6379 stats --watch      # live counters, until Ctrl-C
  tide pause emails                             # stop servers taking its tasks
  tide queues rm orders-v1                      # remove an empty queue
  tide limits set orders --concurrency 10 --rate 100/1s   # at most 10 running, 100 starts a second
  tide limits set emails --group-concurrency 2  # at most 2 running per group (tide.Group)
  tide groups emails                            # the groups with the largest backlogs
  tide tasks wait images resize:42 --timeout 5m # until it is completed (exit 0) or archived (4)
  tide workflows                                # workflows, newest first, with their progress
  tide workflows show fulfil-order-42           # its steps: state, task, what they run after, errors
  tide workflows cancel fulfil-order-42         # start no more of its steps, stop the running ones
  tide batches show b01J0Q3ZP6W5X8K2N4M7R9T1V3  # succeeded, failed, pending, the failed task IDs
  tide events on orders                         # record its tasks' events (off by default)
  tide events tail orders --json                # each event as it happens, until Ctrl-C
  tide dash                                     # the web dashboard, on 127.0.0.1:8080
  TIDE_DASH_TOKEN=... tide dash --addr :8080    # ... on every interface, with a login for changes
  TIDE_GATEWAY_TOKENS=... tide serve            # the HTTP gateway for other languages
  tide version                                  # the version of tide and Go

Commands that show or write payloads (tasks ls, show and wait, dash, serve) take
--encryption-keys, default $TIDE_ENCRYPTION_KEYS, for payloads encrypted
with encrypt.Wrap. dash and serve log at $TIDE_LOG_LEVEL (default info).

Text read from Redis (task types, IDs, errors, payloads, group names...) is printed with
its control characters escaped, e.g. ESC as \x1b: see 'tide tasks show --help'.

Run 'tide <command> --help' for a command's flags and examples.
`

func (a *app) topHelp(w io.Writer) {
	var b strings.Builder
	seen := map[string]bool{}
	for _, c := range commands {
		group, _, isSub := strings.Cut(c.name, " ")
		if isSub {
			if seen[group] {
				continue
			}
			seen[group] = true
			var subs []string
			for _, s := range commands {
				if g, sub, ok := strings.Cut(s.name, " "); ok && g == group {
					subs = append(subs, sub)
				}
			}
			fmt.Fprintf(&b, "  %-10s %s (%s)\n", group, groups[group], strings.Join(subs, ", "))
			continue
		}
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, topHelpText, b.String())
}

func (a *app) groupHelp(w io.Writer, group string) {
	fmt.Fprintf(w, "Usage: tide %s <subcommand> [arguments] [flags]\n\n%s.\n\nSubcommands:\n", group, upperFirst(groups[group]))
	for _, c := range commands {
		if g, sub, ok := strings.Cut(c.name, " "); ok && g == group {
			fmt.Fprintf(w, "  %-8s %s\n", sub, c.summary)
		}
	}
	fmt.Fprintf(w, "\nRun 'tide %s <subcommand> --help' for details.\n", group)
}

func (a *app) commandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: tide %s %s\n\n%s\n", c.name, c.args, strings.TrimSpace(c.help))
	if c.flags != nil {
		fs := c.flagSet(&cmdOpts{})
		var b strings.Builder
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			left := "--" + f.Name
			if name != "" {
				left += " " + name
			}
			fmt.Fprintf(&b, "  %-22s %s", left, usage)
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" && f.DefValue != "0s" {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
			b.WriteString("\n")
		})
		if b.Len() > 0 {
			fmt.Fprintf(w, "\nFlags:\n%s", b.String())
		}
	}
	fmt.Fprintln(w, "\nGlobal flags --redis, --prefix, --partitions and --json work here too (see 'tide --help').")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func init() {
	commands = []*command{
		cmdQueues, cmdQueuesRepartition, cmdQueuesRm, cmdTasksLs, cmdTasksShow, cmdTasksDelete, cmdTasksRun, cmdTasksArchive, cmdTasksCancel, cmdTasksWait,
		cmdWorkflowsLs, cmdWorkflowsShow, cmdWorkflowsCancel, cmdBatchesLs, cmdBatchesShow, cmdBatchesCancel,
		cmdPause, cmdUnpause, cmdLimitsGet, cmdLimitsSet, cmdEventsOn, cmdEventsOff, cmdEventsTail, cmdGroups, cmdServers, cmdStats, cmdCronLs, cmdDash, cmdServe, cmdVersion,
	}
}

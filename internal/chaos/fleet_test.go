package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// runDir returns the directory of a run's files: a temporary one, or a new
// one in $TIDE_CHAOS_KEEP that is kept for a post-mortem.
func runDir(t *testing.T, pattern string) string {
	keep := os.Getenv("TIDE_CHAOS_KEEP")
	if keep == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(keep, pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("run files kept in %s", dir)
	return dir
}

// fleet runs worker processes (the test binary re-executed, see runWorker)
// and remembers every incarnation, when it was SIGKILLed and how the others
// exited.
type fleet struct {
	t                 *testing.T
	dir, addr, prefix string
	env               []string            // NAME=value given to every process
	envOf             map[string][]string // and to every incarnation of one worker (setEnv)
	// awaitReady: its processes write readyFile once they handle SIGTERM
	// (runModelProcess); a SIGTERM waits for it, or a process still
	// starting (slow on a loaded machine) dies of the signal instead of
	// shutting down.
	awaitReady bool

	mu    sync.Mutex
	all   []*proc          // every incarnation started
	live  map[string]*proc // current incarnation by worker name
	kills []kill
	stops []stop
}

// stop is one SIGSTOP..SIGCONT of a worker process: a paused server (a long
// GC pause, a stopped VM) that outlives its leases and then resumes.
type stop struct {
	name     string
	inc      int
	from, to time.Time
}

// proc is one worker process.
type proc struct {
	name     string
	inc      int
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	expected bool          // we signalled it (guarded by fleet.mu)
	state    *os.ProcessState
	started  time.Time
}

// kill is one SIGKILL of a worker process.
type kill struct {
	name string
	inc  int
	at   time.Time
}

func newFleet(t *testing.T, dir, addr, prefix string) *fleet {
	f := &fleet{t: t, dir: dir, addr: addr, prefix: prefix, live: map[string]*proc{}, envOf: map[string][]string{}}
	t.Cleanup(func() {
		f.mu.Lock()
		ps := append([]*proc(nil), f.all...)
		for _, p := range ps {
			p.expected = true
		}
		f.mu.Unlock()
		for _, p := range ps {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return f
}

// setEnv gives every incarnation of worker name started from now on the
// environment variables env (NAME=value), after the fleet's: a worker that
// reaches Redis through its own proxy, for example (envAddr).
func (f *fleet) setEnv(name string, env ...string) {
	f.mu.Lock()
	f.envOf[name] = env
	f.mu.Unlock()
}

// start starts the next incarnation of worker name, with extra environment
// variables (NAME=value) if any.
func (f *fleet) start(name string, env ...string) {
	f.t.Helper()
	f.mu.Lock()
	inc := 1
	if old := f.live[name]; old != nil {
		inc = old.inc + 1
	}
	own := f.envOf[name]
	f.mu.Unlock()
	errf, err := os.Create(stderrFile(f.dir, name, inc))
	if err != nil {
		f.t.Fatal(err)
	}
	defer errf.Close() // the child has its own copy
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		workerEnv+"="+name, envAddr+"="+f.addr, envPrefix+"="+f.prefix,
		envDir+"="+f.dir, envIncarnat+"="+strconv.Itoa(inc))
	cmd.Env = append(cmd.Env, f.env...)
	cmd.Env = append(cmd.Env, own...) // the last of a name counts
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = errf, errf
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start worker %s: %v", name, err)
	}
	p := &proc{name: name, inc: inc, cmd: cmd, done: make(chan struct{}), started: time.Now()}
	go func() {
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	f.mu.Lock()
	f.all = append(f.all, p)
	f.live[name] = p
	f.mu.Unlock()
}

// pause stops the live incarnation of name with SIGSTOP for d, then lets it
// go on with SIGCONT.
func (f *fleet) pause(name string, d time.Duration) {
	f.t.Helper()
	f.mu.Lock()
	p := f.live[name]
	f.mu.Unlock()
	from := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	f.mu.Lock()
	f.stops = append(f.stops, stop{name: name, inc: p.inc, from: from, to: time.Now()})
	f.mu.Unlock()
}

// killAndRestart SIGKILLs the live incarnation of name and starts the next.
// It returns the incarnation it killed.
func (f *fleet) killAndRestart(name string) int {
	f.t.Helper()
	f.mu.Lock()
	p := f.live[name]
	p.expected = true
	f.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	f.mu.Lock()
	f.kills = append(f.kills, kill{name: name, inc: p.inc, at: time.Now()})
	f.mu.Unlock()
	f.start(name)
	return p.inc
}

// restart stops the live incarnation of name gracefully (SIGTERM: the
// server shuts down and checks for leaked goroutines), waits for it at most
// limit, and starts the next: one step of a rolling deploy. It returns what
// went wrong with the stopped one.
func (f *fleet) restart(name string, limit time.Duration) error {
	f.mu.Lock()
	p := f.live[name]
	p.expected = true
	f.mu.Unlock()
	f.whenReady(p, limit)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-p.done:
		err = f.exitError(p)
	case <-time.After(limit):
		err = fmt.Errorf("worker %s.%d did not exit within %v of SIGTERM", p.name, p.inc, limit)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	f.start(name)
	return err
}

// whenReady waits, when the fleet's processes announce it, until p handles
// SIGTERM (its readyFile exists) or exited, at most limit.
func (f *fleet) whenReady(p *proc, limit time.Duration) {
	if !f.awaitReady {
		return
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(readyFile(f.dir, p.name, p.inc)); err == nil {
			return
		}
		select {
		case <-p.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exitError tells what is wrong with how the exited process p ended, or nil
// for a clean exit.
func (f *fleet) exitError(p *proc) error {
	report, _ := os.ReadFile(exitFile(f.dir, p.name, p.inc))
	switch code := p.state.ExitCode(); code {
	case exitClean:
		return nil
	case exitLeak:
		return fmt.Errorf("worker %s.%d leaked goroutines: %s", p.name, p.inc, report)
	default:
		stderr, _ := os.ReadFile(stderrFile(f.dir, p.name, p.inc))
		return fmt.Errorf("worker %s.%d exited with %v: %s\n%s", p.name, p.inc, p.state, report, tail(stderr, 4000))
	}
}

// unexpected lists the processes that exited without being signalled.
func (f *fleet) unexpected() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.all {
		select {
		case <-p.done:
			if !p.expected {
				out = append(out, fmt.Sprintf("%s.%d: %v", p.name, p.inc, p.state))
			}
		default:
		}
	}
	return out
}

// terminate sends SIGTERM to every live process and waits (bounded) for
// them to exit; it returns one error per process that did not exit cleanly.
func (f *fleet) terminate(limit time.Duration) []error {
	f.mu.Lock()
	var ps []*proc
	for _, p := range f.live {
		p.expected = true
		ps = append(ps, p)
	}
	f.mu.Unlock()
	for _, p := range ps {
		f.whenReady(p, limit)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	deadline := time.After(limit)
	for _, p := range ps {
		select {
		case <-p.done:
		case <-deadline:
			errs = append(errs, fmt.Errorf("worker %s.%d did not exit within %v of SIGTERM", p.name, p.inc, limit))
			continue
		}
		if err := f.exitError(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// shutdown ends a model run's fleet: terminate, then one error per process
// that exited without being signalled and per stderr file that shows a data
// race or a panic.
func (f *fleet) shutdown(limit time.Duration) []error {
	errs := f.terminate(limit)
	for _, u := range f.unexpected() {
		errs = append(errs, fmt.Errorf("worker exited unexpectedly: %s", u))
	}
	stderrs, _ := filepath.Glob(filepath.Join(f.dir, "stderr-*.txt"))
	for _, p := range stderrs {
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte("DATA RACE")) || bytes.Contains(b, []byte("panic:")) {
			errs = append(errs, fmt.Errorf("%s:\n%s", filepath.Base(p), tail(b, 8000)))
		}
	}
	return errs
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Package sqltest starts a throwaway PostgreSQL or MariaDB server for the
// outbox tests: a data directory in a temp dir, a free loopback port and a
// unix socket directory inside the data directory. A package starts each
// server once, in TestMain, and every test takes a database of its own
// (NewDB), so that tests can run in parallel.
//
// When the tests run as root, the servers (which refuse root) run as the
// unprivileged user "postgres" or "mysql" if present, else "nobody", with
// the temp dir handed to that user.
package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// Kind names a database server.
type Kind string

// The servers sqltest starts.
const (
	Postgres Kind = "postgres"
	MariaDB  Kind = "mariadb"
)

// Server is a running database server.
type Server struct {
	Kind Kind
	Dir  string // temp dir holding data, socket and log
	Port int
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	seq  atomic.Int64
}

// Start starts a server of kind k and waits until it accepts connections.
// The error names the missing binary when one is not installed.
func Start(k Kind) (*Server, error) {
	switch k {
	case Postgres:
		return startPostgres()
	case MariaDB:
		return startMariaDB()
	}
	return nil, fmt.Errorf("sqltest: unknown server kind %q", k)
}

// Must is Start for TestMain: it prints the error and exits with status 1
// when the server cannot start.
func Must(k Kind) *Server {
	s, err := Start(k)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return s
}

// findBin looks for name on PATH and then in dirs.
func findBin(name string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		matches, _ := filepath.Glob(filepath.Join(d, name))
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.Mode()&0o111 != 0 {
				return m, nil
			}
		}
	}
	return "", fmt.Errorf("sqltest: %s not found on PATH or in %s: install it (CI installs the PostgreSQL 15 and MariaDB server packages)", name, strings.Join(dirs, ", "))
}

// runAs returns the credential to run a server with: nil unless we are root.
func runAs(names ...string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, n := range names {
		u, err := user.Lookup(n)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("sqltest: running as root and none of the users %v exists to run the database server as", names)
}

func chownAll(dir string, c *syscall.Credential) error {
	if c == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(c.Uid), int(c.Gid))
	})
}

func command(c *syscall.Credential, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = sysProcAttr(c)
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startPostgres() (*Server, error) {
	dirs := []string{"/usr/local/bin", "/usr/lib/postgresql/*/bin"}
	initdb, err := findBin("initdb", dirs...)
	if err != nil {
		return nil, err
	}
	postgres, err := findBin("postgres", dirs...)
	if err != nil {
		return nil, err
	}
	cred, err := runAs("postgres", "nobody")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sqltest-pg-")
	if err != nil {
		return nil, fmt.Errorf("sqltest: %w", err)
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, fmt.Errorf("sqltest: %w", err)
	}
	if err := chownAll(dir, cred); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sqltest: hand %s to the server user: %w", dir, err)
	}
	out, err := command(cred, initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sqltest: %s failed: %v\n%s", initdb, err, out)
	}
	s := &Server{Kind: Postgres, Dir: dir, log: filepath.Join(dir, "postgres.log")}
	err = s.launch(cred, func(port int) []string {
		return []string{postgres, "-D", data, "-p", strconv.Itoa(port), "-k", sock, "-h", "127.0.0.1",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=500", "-c", "shared_buffers=64MB"}
	})
	return s, err
}

func startMariaDB() (*Server, error) {
	installDB, err := findBin("mariadb-install-db", "/usr/bin", "/usr/local/bin")
	if err != nil {
		return nil, err
	}
	mariadbd, err := findBin("mariadbd", "/usr/sbin", "/usr/local/sbin", "/usr/local/bin")
	if err != nil {
		return nil, err
	}
	cred, err := runAs("mysql", "nobody")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sqltest-maria-")
	if err != nil {
		return nil, fmt.Errorf("sqltest: %w", err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, fmt.Errorf("sqltest: %w", err)
	}
	if err := chownAll(dir, cred); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sqltest: hand %s to the server user: %w", dir, err)
	}
	out, err := command(cred, installDB, "--no-defaults", "--datadir="+data, "--auth-root-authentication-method=normal",
		"--skip-test-db").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sqltest: %s failed: %v\n%s", installDB, err, out)
	}
	s := &Server{Kind: MariaDB, Dir: dir, log: filepath.Join(dir, "mariadb.log")}
	err = s.launch(cred, func(port int) []string {
		return []string{mariadbd, "--no-defaults", "--datadir=" + data, "--port=" + strconv.Itoa(port),
			"--bind-address=127.0.0.1", "--socket=" + filepath.Join(dir, "mysql.sock"),
			"--pid-file=" + filepath.Join(dir, "mariadb.pid"), "--log-error=" + s.log,
			"--skip-grant-tables", "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=2",
			"--innodb-buffer-pool-size=64M", "--max-connections=500", "--skip-log-bin"}
	})
	return s, err
}

// launch starts the server on a free port (retrying on port races) and
// waits until it answers.
func (s *Server) launch(cred *syscall.Credential, argv func(port int) []string) error {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("sqltest: free port: %w", err)
		}
		args := argv(port)
		cmd := command(cred, args[0], args[1:]...)
		logf, err := os.OpenFile(filepath.Join(s.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("sqltest: %w", err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return fmt.Errorf("sqltest: start %s: %w", args[0], err)
		}
		logf.Close()
		s.cmd, s.Port, s.done = cmd, port, make(chan struct{})
		go func() { _ = cmd.Wait(); close(s.done) }()
		if lastErr = s.waitReady(60 * time.Second); lastErr == nil {
			return nil
		}
		s.kill()
	}
	tail := s.logTail()
	os.RemoveAll(s.Dir)
	return fmt.Errorf("sqltest: %s did not start: %v\n%s", s.Kind, lastErr, tail)
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-s.done:
			return errors.New("the server exited")
		default:
		}
		db, err := sql.Open(s.driver(), s.DSN(s.adminDB()))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = db.PingContext(ctx)
			cancel()
			db.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) logTail() string {
	var b strings.Builder
	for _, f := range []string{s.log, filepath.Join(s.Dir, "stdout.log")} {
		data, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		fmt.Fprintf(&b, "--- %s ---\n%s\n", filepath.Base(f), strings.Join(lines, "\n"))
	}
	return b.String()
}

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	// SIGQUIT is PostgreSQL's immediate shutdown; MariaDB needs SIGKILL
	// to stop at once (data is thrown away anyway).
	sig := syscall.SIGKILL
	if s.Kind == Postgres {
		sig = syscall.SIGQUIT
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Stop stops the server and removes its temp dir. It is idempotent.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	s.kill()
	if s.Dir != "" {
		os.RemoveAll(s.Dir)
		s.Dir = ""
	}
}

// Driver returns the database/sql driver name for the server: "pgx" or
// "mysql".
func (s *Server) driver() string {
	if s.Kind == Postgres {
		return "pgx"
	}
	return "mysql"
}

// Driver returns the database/sql driver name to open the server's DSNs with.
func (s *Server) Driver() string { return s.driver() }

func (s *Server) adminDB() string {
	if s.Kind == Postgres {
		return "postgres"
	}
	return "mysql"
}

// DSN returns a data source name for database db on the server.
func (s *Server) DSN(db string) string {
	if s.Kind == Postgres {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
	}
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s?parseTime=true&multiStatements=false", s.Port, db)
}

// CreateDB creates a new empty database with a unique name and returns its
// name.
func (s *Server) CreateDB(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.seq.Add(1))
	admin, err := sql.Open(s.driver(), s.DSN(s.adminDB()))
	if err != nil {
		return "", fmt.Errorf("sqltest: %w", err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("sqltest: create database %s: %w", name, err)
	}
	return name, nil
}

// NewDB creates a database of t's own and returns a handle to it, closed
// when t ends.
func (s *Server) NewDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, err := s.CreateDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open(s.driver(), s.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, s.DSN(name)
}

// NewDBHandle is NewDB without the DSN.
func (s *Server) NewDBHandle(t testing.TB) *sql.DB {
	t.Helper()
	db, _ := s.NewDB(t)
	return db
}

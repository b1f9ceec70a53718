// Package sqltest is test support, not part of the outbox API: it starts a
// throwaway PostgreSQL or MariaDB server (a data directory in a temp dir,
// a free loopback port) for tests outside the outbox module, such as the
// tide command's, that cannot import the outbox's internal test helpers.
// It needs the server binaries installed (postgres and initdb, or
// mariadbd); Start names a missing one. Start each server once, in
// TestMain, and give every test a database of its own (Server.NewDB).
//
// It re-exports the outbox's internal sqltest package unchanged.
package sqltest

import "github.com/tidequeue/tide/outbox/internal/sqltest"

// Kind names a database server.
type Kind = sqltest.Kind

// The servers Start starts.
const (
	Postgres = sqltest.Postgres
	MariaDB  = sqltest.MariaDB
)

// Server is a running database server; Stop it when done. Its methods
// give DSNs (DSN), the database/sql driver name (Driver) and databases of
// a test's own (NewDB).
type Server = sqltest.Server

// Start starts a server of kind k and waits until it accepts connections.
// The error names the missing binary when one is not installed.
func Start(k Kind) (*Server, error) { return sqltest.Start(k) }

// Must is Start for TestMain: it prints the error and exits with status 1
// when the server cannot start.
func Must(k Kind) *Server { return sqltest.Must(k) }

// Command sqlserve starts the throwaway PostgreSQL and MariaDB servers of
// the outbox tests, prints a DSN for a fresh database on each, and keeps
// them running until interrupted; the servers and their data are removed
// then. It is for benchmarks and manual tries:
//
//	go run ./outbox/internal/sqltest/sqlserve
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tidequeue/tide/outbox/internal/sqltest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var started []*sqltest.Server
	defer func() {
		for _, s := range started {
			s.Stop()
		}
	}()
	for _, k := range []sqltest.Kind{sqltest.Postgres, sqltest.MariaDB} {
		s, err := sqltest.Start(k)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		started = append(started, s)
		db, err := s.CreateDB(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		fmt.Printf("%s %s\n", k, s.DSN(db))
	}
	fmt.Println("running; interrupt to stop")
	<-ctx.Done()
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/tidequeue/tide/internal/redistest"
	"github.com/tidequeue/tide/outbox/internal/sqltest"
)

var pg *sqltest.Server

func TestMain(m *testing.M) {
	var err error
	if pg, err = sqltest.Start(sqltest.Postgres); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	os.Exit(code)
}

func TestDemo(t *testing.T) {
	for _, mode := range []string{"memory", "redis"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			_, dsn := pg.NewDB(t)
			redisAddr := ""
			if mode == "redis" {
				redisAddr = redistest.Addr(t)
			}
			var out, errOut bytes.Buffer
			getenv := func(k string) string {
				if k == "TIDE_REDIS_ADDR" {
					return redisAddr
				}
				return ""
			}
			code := run(context.Background(), []string{"-dsn", dsn, "-cancel-after", "300ms"}, getenv, &out, &errOut)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, &out, &errOut)
			}
			for _, want := range []string{"rolled back", "paid order 2: ", "order 1: cancelled", "order 3: cancelled", "done"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
	if code := run(context.Background(), nil, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("no -dsn: exit %d, want 2", code)
	}
}

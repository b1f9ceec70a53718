package sqltest

import (
	"context"
	"strings"
	"testing"
)

func TestStartBoth(t *testing.T) {
	for _, k := range []Kind{Postgres, MariaDB} {
		t.Run(string(k), func(t *testing.T) {
			s, err := Start(k)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			db, _ := s.NewDB(t)
			var n int
			if err := db.QueryRowContext(context.Background(), "SELECT 1").Scan(&n); err != nil || n != 1 {
				t.Fatalf("SELECT 1: %d, %v", n, err)
			}
		})
	}
}

func TestMissingBinaryNamed(t *testing.T) {
	_, err := findBin("no-such-db-server-binary", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no-such-db-server-binary not found") {
		t.Fatalf("error %v does not name the missing binary", err)
	}
}

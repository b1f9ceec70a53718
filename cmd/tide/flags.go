package main

import (
	"flag"
	"fmt"
	"strings"
	"time"
)

// parseInterleaved parses fs over args, allowing flags after positional
// arguments ("tasks ls orders --state retry"), and returns the positional
// arguments. Everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// durationFlag is a positive duration flag.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q (use e.g. 500ms, 2s, 1m)", v)
	}
	if x <= 0 {
		return fmt.Errorf("duration %q must be positive", v)
	}
	*d = durationFlag(x)
	return nil
}

package redisbroker

import (
	"context"
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// scripts holds every state-changing script, each prefixed with lib.lua.
type scripts struct {
	enqueue, dequeue, extend, settle, setResult, delete, maintain, admin *redis.Script
}

func loadScripts() *scripts {
	lib := mustRead("lib.lua")
	s := func(name string) *redis.Script { return redis.NewScript(lib + "\n" + mustRead(name)) }
	return &scripts{
		enqueue:   s("enqueue.lua"),
		dequeue:   s("dequeue.lua"),
		extend:    s("extend.lua"),
		settle:    s("settle.lua"),
		setResult: s("setresult.lua"),
		delete:    s("delete.lua"),
		maintain:  s("maintain.lua"),
		admin:     s("admin.lua"),
	}
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("tide: redisbroker: missing embedded script " + name)
	}
	return string(b)
}

// call is one script invocation destined for one partition.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// runAll runs the calls in one pipeline (go-redis splits it per node on a
// cluster). Calls whose script is not cached yet are sent again with EVAL.
func runAll(ctx context.Context, rdb redis.UniversalClient, calls []*call) error {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.Run(ctx, rdb, c.keys, c.args...)
		return nil
	}
	pipe := rdb.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	var retry []*call
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			retry = append(retry, c)
		}
	}
	if len(retry) == 0 {
		return nil
	}
	pipe = rdb.Pipeline()
	for _, c := range retry {
		c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	return nil
}

// Package chaos holds the chaos tests of tide. They run servers as separate
// processes against a Redis behind the fault-injection proxy
// (internal/faultproxy), SIGKILL and SIGSTOP them, restart Redis, cut the
// network and delay and drop replies so that go-redis re-sends commands,
// then check that no task was lost, that no re-sent request doubled one, and
// that the duplicates kills and pauses cause stay within what the
// at-least-once contract allows.
//
// TestFlowModel and TestFlowModelMem are a model-based test of workflows
// and batches (flowmodel_*_test.go): random DAGs and batches with random
// outcomes, random operator actions through the public API, rolling
// restarts, SIGKILLs and lost replies; at the end every flow must have
// ended, with an outcome that the log of what its handlers and the
// operator did explains. The seed and length are flags:
//
//	go test -race -run FlowModel ./internal/chaos -args -flowmodel.seed=7 -flowmodel.scale=10
//
// TestLimitModel and TestLimitModelMem are a model-based test of flow
// control (limitmodel_*_test.go): random limits changed at runtime over
// grouped, ordered, deferred and throttled work, replaced, cancelled and
// deleted tasks, a repartition, a SIGKILL and a server cut off past its
// lease; the handlers log their starts and ends on Redis's clock and the
// checker replays the log against the limits in force:
//
//	go test -race -run LimitModel ./internal/chaos -args -limitmodel.seed=7 -limitmodel.scale=10
package chaos

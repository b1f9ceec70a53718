package tide

import (
	"fmt"
	"strings"

	"github.com/tidequeue/tide/broker"
)

// What tide keeps for itself. A workflow's follow-ups and NotifyURL
// notifications are tasks that tide's own settle path stores (marked
// internal by the broker: broker.Delivery.Internal); a server runs them only
// when they carry that mark. No public entry point (Enqueue, EnqueueMany,
// EnqueuePrepared, Prepare, a workflow's or batch's tasks, and through them
// the gateway, the outbox relay and the Scheduler) accepts a task that names
// them: their types, the headers that make a task a workflow step, and
// task IDs with the prefix ReservedIDPrefix are refused with an error
// wrapping ErrInvalidTask.

// ReservedIDPrefix starts the IDs of the tasks tide stores itself (see
// broker.FollowupID). TaskID refuses IDs with this prefix, so no task can
// take such an ID before tide does.
const ReservedIDPrefix = broker.ReservedIDPrefix

// stepHeaders are the headers that make a task a workflow step or batch
// task; only EnqueueWorkflow and EnqueueBatch set them.
var stepHeaders = []string{flowHeader, stepHeader, broker.SealedHeader}

// checkReservedType refuses tide's own task types.
func checkReservedType(typ string) error {
	if typ == FlowType || typ == NotifyType {
		return fmt.Errorf("%w: task type %q is tide's own (stored only by a server, with the outcome of the task it follows); choose another type", ErrInvalidTask, typ)
	}
	return nil
}

// checkReservedID refuses IDs in tide's own namespace.
func checkReservedID(id string) error {
	if strings.HasPrefix(id, ReservedIDPrefix) {
		return fmt.Errorf("%w: task ID %q: IDs that begin with %q are tide's own", ErrInvalidTask, id, ReservedIDPrefix)
	}
	return nil
}

// checkReservedHeaders refuses the headers of workflow steps and, unless
// notify is set, the NotifyURL header (which Prepare stores with the task,
// so EnqueuePrepared accepts it and checks the URL). Header names are
// compared without regard to case.
func checkReservedHeaders(headers map[string]string, notify bool) error {
	for k, v := range headers {
		lk := strings.ToLower(k)
		for _, h := range stepHeaders {
			if lk == h {
				return fmt.Errorf("%w: header %q is tide's own (set on workflow steps and batch tasks only)", ErrInvalidTask, k)
			}
		}
		if lk != notifyHeader {
			continue
		}
		if !notify || k != notifyHeader {
			return fmt.Errorf("%w: header %q is tide's own; use the NotifyURL option", ErrInvalidTask, k)
		}
		if err := checkNotifyURL(v); err != nil {
			return fmt.Errorf("%w: header %q: %v", ErrInvalidTask, k, err)
		}
	}
	return nil
}

package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/tidequeue/tide/tidetype"
)

// Unsupported answers every method of the parts of Broker beyond Core with
// an error wrapping ErrNotSupported (and Now with time.Now): a broker that
// implements only Core embeds it to be a Broker, and overrides what it
// has. Its zero value is ready to use; it is safe for concurrent use.
type Unsupported struct{}

func notSupported(what string) error { return fmt.Errorf("%w: %s", ErrNotSupported, what) }

// Now implements Clock with the local clock.
func (Unsupported) Now() time.Time { return time.Now() }

// Queues implements Admin.
func (Unsupported) Queues(context.Context) ([]string, error) { return nil, notSupported("Queues") }

// QueueInfo implements Admin.
func (Unsupported) QueueInfo(context.Context, string) (*tidetype.QueueInfo, error) {
	return nil, notSupported("QueueInfo")
}

// History implements Admin.
func (Unsupported) History(context.Context, string, int) ([]tidetype.DailyStats, error) {
	return nil, notSupported("History")
}

// ListTasks implements Admin.
func (Unsupported) ListTasks(context.Context, string, tidetype.TaskState, int, int) ([]*tidetype.TaskInfo, error) {
	return nil, notSupported("ListTasks")
}

// SearchTasks implements Admin.
func (Unsupported) SearchTasks(context.Context, string, tidetype.TaskState, tidetype.TaskFilter, int, int) ([]*tidetype.TaskInfo, int, error) {
	return nil, 0, notSupported("SearchTasks")
}

// Series implements Admin.
func (Unsupported) Series(context.Context, string, time.Time) ([]tidetype.Point, error) {
	return nil, notSupported("Series")
}

// StoreInfo implements Admin.
func (Unsupported) StoreInfo(context.Context) (*tidetype.StoreInfo, error) {
	return nil, notSupported("StoreInfo")
}

// RunTask implements Admin.
func (Unsupported) RunTask(context.Context, string, string) error { return notSupported("RunTask") }

// ArchiveTask implements Admin.
func (Unsupported) ArchiveTask(context.Context, string, string) error {
	return notSupported("ArchiveTask")
}

// RunTasks implements Admin.
func (Unsupported) RunTasks(context.Context, string, tidetype.TaskState, int) (int, error) {
	return 0, notSupported("RunTasks")
}

// ArchiveTasks implements Admin.
func (Unsupported) ArchiveTasks(context.Context, string, tidetype.TaskState, int) (int, error) {
	return 0, notSupported("ArchiveTasks")
}

// DeleteTasks implements Admin.
func (Unsupported) DeleteTasks(context.Context, string, tidetype.TaskState, int) (int, error) {
	return 0, notSupported("DeleteTasks")
}

// PauseFor implements Admin.
func (Unsupported) PauseFor(context.Context, string, time.Duration) error {
	return notSupported("PauseFor")
}

// DeleteQueue implements Admin.
func (Unsupported) DeleteQueue(context.Context, string) error { return notSupported("DeleteQueue") }

// CancelProcessing implements Admin.
func (Unsupported) CancelProcessing(context.Context, string, string) error {
	return notSupported("CancelProcessing")
}

// SetQueueLimits implements Admin.
func (Unsupported) SetQueueLimits(context.Context, string, tidetype.QueueLimits) error {
	return notSupported("SetQueueLimits")
}

// QueueLimits implements Admin.
func (Unsupported) QueueLimits(context.Context, string) (tidetype.QueueLimits, error) {
	return tidetype.QueueLimits{}, notSupported("QueueLimits")
}

// Groups implements Admin.
func (Unsupported) Groups(context.Context, string, int) ([]tidetype.GroupInfo, error) {
	return nil, notSupported("Groups")
}

// Servers implements Admin.
func (Unsupported) Servers(context.Context) ([]tidetype.ServerInfo, error) {
	return nil, notSupported("Servers")
}

// SchedulerEntries implements Admin.
func (Unsupported) SchedulerEntries(context.Context) ([]tidetype.SchedulerEntry, error) {
	return nil, notSupported("SchedulerEntries")
}

// RegisterServer implements Registry.
func (Unsupported) RegisterServer(context.Context, tidetype.ServerInfo, time.Duration) error {
	return notSupported("RegisterServer")
}

// UnregisterServer implements Registry.
func (Unsupported) UnregisterServer(context.Context, string) error {
	return notSupported("UnregisterServer")
}

// RegisterSchedulerEntries implements Registry.
func (Unsupported) RegisterSchedulerEntries(context.Context, string, []tidetype.SchedulerEntry, time.Duration) error {
	return notSupported("RegisterSchedulerEntries")
}

// CreateFlow implements Flows.
func (Unsupported) CreateFlow(context.Context, *Flow) ([]ReadyStep, error) {
	return nil, notSupported("workflows and batches")
}

// EndStep implements Flows.
func (Unsupported) EndStep(context.Context, string, string, string, bool, string) ([]ReadyStep, error) {
	return nil, notSupported("workflows and batches")
}

// ReleaseSteps implements Flows.
func (Unsupported) ReleaseSteps(context.Context, string, []string) ([]string, error) {
	return nil, notSupported("workflows and batches")
}

// CancelFlow implements Flows.
func (Unsupported) CancelFlow(context.Context, string) ([]tidetype.StepInfo, error) {
	return nil, notSupported("workflows and batches")
}

// CancelStepTask implements Flows.
func (Unsupported) CancelStepTask(context.Context, string, string) error {
	return notSupported("workflows and batches")
}

// GetFlow implements Flows.
func (Unsupported) GetFlow(context.Context, string, bool) (*tidetype.WorkflowInfo, error) {
	return nil, notSupported("workflows and batches")
}

// GetStep implements Flows.
func (Unsupported) GetStep(context.Context, string, string) (*tidetype.StepInfo, error) {
	return nil, notSupported("workflows and batches")
}

// ListFlows implements Flows.
func (Unsupported) ListFlows(context.Context, tidetype.FlowKind, int, int) ([]*tidetype.WorkflowInfo, int, error) {
	return nil, 0, notSupported("workflows and batches")
}

// ConfirmFlow implements Flows.
func (Unsupported) ConfirmFlow(context.Context, string) error {
	return notSupported("workflows and batches")
}

// RepairFlows implements Flows.
func (Unsupported) RepairFlows(context.Context, time.Duration, int) ([]string, error) {
	return nil, notSupported("workflows and batches")
}

// ReadySteps implements Flows.
func (Unsupported) ReadySteps(context.Context, string) ([]ReadyStep, error) {
	return nil, notSupported("workflows and batches")
}

// Wait implements Waiter.
func (Unsupported) Wait(context.Context, string, string) (*tidetype.TaskInfo, error) {
	return nil, notSupported("Wait")
}

// SetProgress implements ProgressReporter.
func (Unsupported) SetProgress(context.Context, LeaseRef, tidetype.Progress) error {
	return notSupported("progress")
}

// ReadEvents implements EventReader.
func (Unsupported) ReadEvents(context.Context, []string, string) (<-chan tidetype.TaskEvent, error) {
	return nil, notSupported("task events")
}

// SetEvents implements EventReader.
func (Unsupported) SetEvents(context.Context, string, bool) error {
	return notSupported("task events")
}

// Repartition implements Repartitioner.
func (Unsupported) Repartition(context.Context, string, int, func(moved, left int)) error {
	return notSupported("repartitioning")
}

var _ Broker = struct {
	Core
	Unsupported
}{}

// LoadSteps implements Durable.
func (Unsupported) LoadSteps(context.Context, LeaseRef) ([]StepRecord, error) {
	return nil, notSupported("LoadSteps")
}

// SaveStep implements Durable.
func (Unsupported) SaveStep(context.Context, LeaseRef, StepRecord) (StepRecord, error) {
	return StepRecord{}, notSupported("SaveStep")
}

// ResolveWait implements Durable.
func (Unsupported) ResolveWait(context.Context, LeaseRef, string, time.Time) (StepRecord, bool, error) {
	return StepRecord{}, false, notSupported("ResolveWait")
}

// Signal implements Durable.
func (Unsupported) Signal(context.Context, string, string, string, []byte) error {
	return notSupported("Signal")
}

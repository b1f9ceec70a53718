package tide

// SetFlowHookForTest sets the function called at each point of advancing
// a workflow ("advance", "ended", "enqueued"), for crash tests.
func SetFlowHookForTest(f func(point, step string)) { flowHook = f }

package tide

import "time"

// SetFlowHookForTest sets the function called at each point of advancing
// a workflow ("advance", "ended", "enqueued"), for crash tests.
func SetFlowHookForTest(f func(point, step string)) { flowHook = f }

// SetFlowRepairForTest makes servers started after it look for flows to
// repair every `every`, taking those begun at least age ago.
func SetFlowRepairForTest(age, every time.Duration) { repairAge, repairEvery = age, every }

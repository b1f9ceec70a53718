package tidetype

import "time"

// MaxProgressNote is the longest note a Progress keeps, in bytes.
const MaxProgressNote = 1024

// Progress is what a running task last reported of its progress
// (tide.ReportProgress). The zero value means nothing was reported.
type Progress struct {
	Percent int       // 0 to 100
	Note    string    // at most MaxProgressNote bytes
	At      time.Time // when it was reported
}

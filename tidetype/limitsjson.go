package tidetype

import (
	"encoding/json"
	"fmt"
	"time"
)

// limitsJSON is QueueLimits in JSON (see QueueLimits.MarshalJSON).
type limitsJSON struct {
	Concurrency      int       `json:"concurrency"`
	Rate             *rateJSON `json:"rate"`
	GroupConcurrency int       `json:"group_concurrency"`
	GroupRate        *rateJSON `json:"group_rate"`
	Ordered          bool      `json:"ordered"`
}

type rateJSON struct {
	Limit      int     `json:"limit"`
	PerSeconds float64 `json:"per_seconds"`
}

func toRateJSON(r Rate) *rateJSON {
	if r.Limit == 0 {
		return nil
	}
	return &rateJSON{r.Limit, r.Per.Seconds()}
}

func (r *rateJSON) rate() Rate {
	if r == nil {
		return Rate{}
	}
	return Rate{Limit: r.Limit, Per: time.Duration(r.PerSeconds * float64(time.Second))}
}

// MarshalJSON writes l as {"concurrency":n,"rate":{"limit":n,"per_seconds":x},
// "group_concurrency":n,"group_rate":{...},"ordered":b}, where 0 and a null
// rate mean no limit: the form of the CLI's --json output and the
// dashboard's JSON API.
func (l QueueLimits) MarshalJSON() ([]byte, error) {
	return json.Marshal(limitsJSON{l.Concurrency, toRateJSON(l.Rate), l.GroupConcurrency, toRateJSON(l.GroupRate), l.Ordered})
}

// UnmarshalJSON reads the form MarshalJSON writes. It does not check the
// limits (broker.CheckQueueLimits does).
func (l *QueueLimits) UnmarshalJSON(b []byte) error {
	var j limitsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("tide: queue limits: %w", err)
	}
	*l = QueueLimits{Concurrency: j.Concurrency, Rate: j.Rate.rate(), GroupConcurrency: j.GroupConcurrency, GroupRate: j.GroupRate.rate(), Ordered: j.Ordered}
	return nil
}

package perf

// The duration mode (-D): perftest's catch_alarm state machine, read from the clock instead
// of SIGALRM. From its start a measurement warms up for the margin (START_STATE), samples
// until the duration less the margin (SAMPLE_STATE: completions counted, the sample's ends
// are the report's tposted[0] and tcompleted[0]), cools down for the margin
// (STOP_SAMPLE_STATE), and ends (END_STATE): the loops stop posting and waiting, whatever is
// still in flight.

import "time"

// perfDuration is one measurement's clock.
type perfDuration struct {
	start         time.Time
	margin, total time.Duration
}

// newPerfDuration starts the clock of c's duration mode now, or returns nil for iterations.
func newPerfDuration(c *perfConfig) *perfDuration {
	if c.Duration == 0 {
		return nil
	}
	return &perfDuration{start: time.Now(), margin: c.Margin, total: c.Duration}
}

// sampling reports whether t is in the sample (SAMPLE_STATE).
func (d *perfDuration) sampling(t time.Time) bool {
	e := t.Sub(d.start)
	return e >= d.margin && e < d.total-d.margin
}

// ended reports whether the measurement is over at t (END_STATE).
func (d *perfDuration) ended(t time.Time) bool { return t.Sub(d.start) >= d.total }

// end is when the measurement is over.
func (d *perfDuration) end() time.Time { return d.start.Add(d.total) }

// window is the sample's length: the report's time.
func (d *perfDuration) window() time.Duration { return d.total - 2*d.margin }

package conform

import (
	"strings"
	"testing"
	"time"
)

// slowDUT answers every PostSend d after the post took effect, as the C agent in the lab's
// TCG guest does: there a control round trip took longer than 4 ms, the ACK timeout of
// code 10, so a DUT with that timeout retransmitted before the bench could answer.
type slowDUT struct {
	DUT
	d time.Duration
}

func (s slowDUT) PostSend(qpn uint32, c SendConfig) error {
	err := s.DUT.PostSend(qpn, c)
	<-time.After(s.d) // the agent's reply is late; the DUT is already sending
	return err
}

// timerScenarios test the requester's ACK timer itself, with the 4 ms timeout: a slow
// control channel cannot be hidden from them.
var timerScenarios = map[string]bool{"req-ack-timeout-retransmit": true, "req-retry-exceeded": true}

// TestRequesterScenariosSlowControl: the requester scenarios that do not test the ACK timer
// pass when every PostSend answer comes 20 ms late (the DUT's ACK timeout must be long
// compared with a control round trip, or it retransmits before the bench answers: the
// req-nak-seq-go-back and req-coalesced-ack failures against rxe in a loaded lab).
func TestRequesterScenariosSlowControl(t *testing.T) {
	b, err := NewLoopback(LoopbackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.DUT = slowDUT{DUT: b.DUT, d: 20 * time.Millisecond}
	b.Reply = 2 * time.Second
	b.Quiet = 150 * time.Millisecond
	n := 0
	for i, sc := range Scenarios() {
		if !strings.HasPrefix(sc.Name, "req-") || timerScenarios[sc.Name] {
			continue
		}
		n++
		t.Run(sc.Name, func(t *testing.T) {
			if r := RunOne(b, &sc, i); r.Result != Pass {
				t.Errorf("%s: %s\n%s", r.Result, r.Detail, strings.Join(r.Log, "\n"))
			}
		})
	}
	if n < 8 {
		t.Errorf("%d requester scenarios, want the 10 that do not test the timer", n)
	}
}

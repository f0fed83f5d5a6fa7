package fault

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/softroce/softroce/pkg/bth"
)

func TestParseDirOptions(t *testing.T) {
	o, err := ParseDirOptions(" drop=0.01, dup=0.5;dupdelay=2ms,reorder=0.02,depth=3,reorderdelay=4ms,corrupt=1e-3," +
		"region=outside-icrc,delay=1ms,jitter=50us,drop:op=ACK:nth=2,delay:op=READ_REQUEST:delay=5ms,drop")
	if err != nil {
		t.Fatal(err)
	}
	want := DirOptions{Drop: 0.01, Duplicate: 0.5, DuplicateDelay: 2 * time.Millisecond, Reorder: 0.02,
		ReorderDepth: 3, ReorderDelay: 4 * time.Millisecond, Corrupt: 1e-3, CorruptRegion: CorruptOutsideICRC,
		Delay: time.Millisecond, Jitter: 50 * time.Microsecond, Rules: []Rule{
			{Action: Drop, Match: MatchOp, Op: bth.OpRCAck, Nth: 2},
			{Action: Delay, Match: MatchOp, Op: bth.OpRCReadRequest, Delay: 5 * time.Millisecond},
			{Action: Drop}}}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("got %+v", o)
	}
	back, err := ParseDirOptions(o.String())
	if err != nil || !reflect.DeepEqual(back, o) {
		t.Fatalf("round trip %q: %+v %v", o.String(), back, err)
	}
	if o, err := ParseDirOptions(""); err != nil || !reflect.DeepEqual(o, DirOptions{}) || o.String() != "" {
		t.Fatalf("empty: %+v %v", o, err)
	}
	for _, s := range []string{"drop=2", "drop=-1", "drop=x", "drop=0.1,drop=0.2", "delay=-1ms", "jitter=1",
		"depth=0", "region=left", "color=1", "explode", "drop:nth=0", "drop=NaN"} {
		if _, err := ParseDirOptions(s); !errors.Is(err, ErrRule) {
			t.Fatalf("%q: %v", s, err)
		}
	}
}

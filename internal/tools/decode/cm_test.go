package decode

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDecodeCMNames: the text form names each CM message of rping.pcap (kernel rxe's rping)
// with its key fields: the REQ's service ID is rdma_cm's TCP port 7174
// (0x0000000001061C06), the REP answers the REQ's comm ID with the same TID, the QPNs and
// starting PSNs are the ones the data packets use (REQ psn = the server's first PSN), DREQ
// names the receiver's QPN. Non-CM packets carry no cm[...] part, and the JSON form is
// unchanged (TestDecodeJSONSchema).
func TestDecodeCMNames(t *testing.T) {
	out, _, code := decode(t, filepath.Join(capDir, "rping.pcap"))
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	want := []string{
		"cm[REQ tid=0x486a6d7a3 lcid=0xa3d7a686 sid=0x0000000001061c06 qpn=0x00001f psn=3087846]",
		"cm[REP tid=0x486a6d7a3 lcid=0xa0d7a686 rcid=0xa3d7a686 qpn=0x00001f psn=11519820]",
		"cm[RTU tid=0x486a6d7a3 lcid=0xa3d7a686 rcid=0xa0d7a686]",
		"cm[DREQ tid=0x486a6d7a3 lcid=0xa3d7a686 rcid=0xa0d7a686 qpn=0x00001f]",
		"cm[DREP tid=0x486a6d7a3 lcid=0xa0d7a686 rcid=0xa3d7a686]",
	}
	got := regexp.MustCompile(`cm\[[^\]]*\]`).FindAllString(out, -1)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("CM messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// the data packets start at the PSNs the CM announced: the server (REQ psn) and the client (REP psn)
	for _, psn := range []string{"psn=3087846 ", "psn=11519820 "} {
		if !regexp.MustCompile(`RC [^\n]*` + psn).MatchString(out) {
			t.Errorf("no RC packet with %s", psn)
		}
	}
	for _, f := range []string{"rc_pingpong_small.pcap", "ud_pingpong.pcap"} {
		out, _, _ := decode(t, filepath.Join(capDir, f))
		if strings.Contains(out, "cm[") {
			t.Errorf("%s: cm[...] on a non-CM packet", f)
		}
	}
}

package perftest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ResultLine is perftest's separator (RESULT_LINE), newline included.
const ResultLine = "---------------------------------------------------------------------------------------\n"

// Column headers (perftest_parameters.h), newline (RESULT_EXT) included.
const (
	HeaderBW      = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"                                                                    // RESULT_FMT
	HeaderBWGbits = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"                                                                    // RESULT_FMT_G
	HeaderLatDur  = " #bytes        #iterations       t_avg[usec]    tps average\n"                                                                                         // RESULT_FMT_LAT_DUR
	HeaderLat     = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n" // RESULT_FMT_LAT
)

// BWHeader returns HeaderBW, or HeaderBWGbits with --report_gbits.
func BWHeader(gbits bool) string {
	if gbits {
		return HeaderBWGbits
	}
	return HeaderBW
}

// BW unit factors (print_report_bw format_factor): MB/sec is MiB per second,
// Gb/sec is 10^9 bits per second.
const (
	BytesPerMB   = 0x100000
	BytesPerGbit = 125000000
)

// NewBWReport computes the report of a BW run as print_report_bw does, from
// the message size, the number of completed messages (iterations x QPs), the
// time from the first post to the last completion, and the best per-message
// time found (peak; 0 = no peak, printed as 0.00 like -N).
func NewBWReport(size, msgs uint64, total, best time.Duration, gbits bool) BWReport {
	f := float64(BytesPerMB)
	if gbits {
		f = BytesPerGbit
	}
	r := BWReport{Size: size, Iters: msgs}
	sec := total.Seconds()
	if sec > 0 {
		r.BWAvg = float64(size) * float64(msgs) / (sec * f)
		r.MsgRate = float64(msgs) / (sec * 1e6)
	}
	if b := best.Seconds(); b > 0 {
		r.BWPeak = float64(size) / (b * f)
	}
	return r
}

// FormatBW is the result line print_full_bw_report prints (REPORT_FMT, or
// REPORT_FMT_EXT with 6 decimals when --report_gbits and BW average < 0.1),
// newline included. remote, if not nil, is added (duplex tests).
func FormatBW(r BWReport, remote *BWReport, gbits bool) string {
	peak, avg, rate := r.BWPeak, r.BWAvg, r.MsgRate
	if remote != nil {
		peak += remote.BWPeak
		avg += remote.BWAvg
		rate += remote.MsgRate
	}
	var b strings.Builder
	if avg < 0.1 && gbits {
		// " %-7lu    %" PRIu64 "           %-7.6lf            %-7.6lf            %-7.6lf"
		fmt.Fprintf(&b, " %-7d    %d           %-7s            %-7s            %-7s\n",
			r.Size, r.Iters, cf(peak, 6), cf(avg, 6), cf(rate, 6))
		return b.String()
	}
	// " %-7lu    %-10" PRIu64 "       %-7.2lf            %-7.2lf\t\t   %-7.6lf"
	fmt.Fprintf(&b, " %-7d    %-10d       %-7s            %-7s\t\t   %-7s\n",
		r.Size, r.Iters, cf(peak, 2), cf(avg, 2), cf(rate, 6))
	return b.String()
}

// LatReport is one line of a latency test's results, in microseconds.
type LatReport struct {
	Size, Iters                  uint64
	Min, Max, Typical, Avg       float64
	Stdev, Percent99, Percent999 float64
}

// LatMeasureTail is how many of the largest samples perftest drops (LAT_MEASURE_TAIL).
const LatMeasureTail = 2

// ErrTooFewSamples reports fewer than LatMeasureTail+1 samples.
var ErrTooFewSamples = errors.New("perftest: too few latency samples")

// NewLatReport computes a latency line as print_report_lat does. samples are
// the iters-1 times between consecutive iterations (tposted[i+1]-tposted[i]);
// halfRTT divides them by two (write and send latency tests report half the
// round trip; read and atomic the whole). Like perftest it sorts, drops the
// LatMeasureTail largest, reports as "t_max" the first dropped one (not the
// largest), takes the median of the rest as t_typical, and computes the
// standard deviation with each deviation truncated to an int (so it is
// usually a whole number). perftest works in CPU cycles with integer median
// arithmetic; here samples are durations, so the median of an even count is
// the exact mean of the two middle values.
func NewLatReport(size, iters uint64, samples []time.Duration, halfRTT bool) (LatReport, error) {
	if len(samples) <= LatMeasureTail {
		return LatReport{}, fmt.Errorf("%w: %d", ErrTooFewSamples, len(samples))
	}
	div := 1.0
	if halfRTT {
		div = 2
	}
	d := make([]float64, len(samples))
	for i, s := range samples {
		d[i] = float64(s.Nanoseconds()) / 1000 / div
	}
	slices.Sort(d)
	m := len(d) - LatMeasureTail
	var median float64
	if (m-1)%2 != 0 {
		median = (d[m/2] + d[m/2-1]) / 2
	} else {
		median = d[m/2]
	}
	var sum float64
	for _, v := range d[:m] {
		sum += v
	}
	avg := sum / float64(m)
	var stdevSum float64
	for _, v := range d[:m] {
		tmp := int64(avg - v)          // int temp_var = average - delta
		stdevSum += float64(tmp * tmp) // int pow_var = pow(temp_var, 2)
	}
	i99 := int(math.Ceil(float64(m) * 0.99))
	i999 := int(math.Ceil(float64(m) * 0.999))
	return LatReport{
		Size: size, Iters: iters,
		Min: d[0], Max: d[m], Typical: median, Avg: avg,
		Stdev:     math.Sqrt(stdevSum / float64(m)),
		Percent99: d[i99], Percent999: d[i999],
	}, nil
}

// FormatLat is the result line print_report_lat prints (REPORT_FMT_LAT),
// newline included.
func FormatLat(r LatReport) string {
	// " %-7lu %" PRIu64 "          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f"
	return fmt.Sprintf(" %-7d %d          %-7s        %-7s      %-7s  \t       %-7s     \t%-7s\t\t%-7s \t\t%-7s\n",
		r.Size, r.Iters, cf(r.Min, 2), cf(r.Max, 2), cf(r.Typical, 2), cf(r.Avg, 2),
		cf(r.Stdev, 2), cf(r.Percent99, 2), cf(r.Percent999, 2))
}

// cf formats like C's %.*f (glibc spellings for inf and nan).
func cf(v float64, prec int) string {
	switch {
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	case math.IsNaN(v):
		if math.Signbit(v) {
			return "-nan"
		}
		return "nan"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// altHex formats v as C's "%#0<width>x": no prefix for zero, else "0x" and
// the digits zero-padded so that the whole is width characters.
func altHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 1), v)
}

// Side selects the "local" or "remote" address line.
type Side uint8

// The sides.
const (
	Local Side = iota
	Remote
)

// AddressLine is the address line ctx_print_pingpong_data prints for d,
// newline included, followed by the GID line when withGID (a GID index is in
// use):
//
//	" %s address: LID %#04x QPN %#06x PSN %#06x" [" OUT %#04x"] [" RKey %#08x VAddr %#016llx"]
//	" GID: %02d:%02d:...:%02d"  (the 16 bytes in decimal)
//
// READ tests print OUT, RKey and VAddr; WRITE tests RKey and VAddr; SEND and
// atomic tests neither.
func AddressLine(t Test, s Side, d Dest, withGID bool) string {
	side := "local"
	if s == Remote {
		side = "remote"
	}
	var b strings.Builder
	fmt.Fprintf(&b, " %s address: LID %s QPN %s PSN %s", side,
		altHex(uint64(d.LID), 4), altHex(uint64(d.QPN), 6), altHex(uint64(d.PSN), 6))
	switch t {
	case ReadBW, ReadLat:
		fmt.Fprintf(&b, " OUT %s", altHex(uint64(d.OutReads), 4))
		fallthrough
	case WriteBW, WriteLat:
		fmt.Fprintf(&b, " RKey %s VAddr %s", altHex(uint64(d.RKey), 8), altHex(d.VAddr, 16))
	}
	b.WriteByte('\n')
	if withGID {
		b.WriteString(" GID: ")
		for i, g := range d.GID {
			if i > 0 {
				b.WriteByte(':')
			}
			fmt.Fprintf(&b, "%02d", g)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// FormatLatDur is print_report_lat_duration's line (REPORT_FMT_LAT_DUR), newline included:
// the average latency over a duration-mode sample of window holding iters round trips
// (halfRTT: WRITE and SEND latency report half of each) and the transactions per second.
func FormatLatDur(size, iters uint64, window time.Duration, halfRTT bool) string {
	var lat, tps float64
	if us := float64(window) / float64(time.Microsecond); iters > 0 && us > 0 {
		lat = us / float64(iters)
		if halfRTT {
			lat /= 2
		}
		tps = float64(iters) / window.Seconds()
	}
	// " %-7lu       %" PRIu64 "            %-7.2f        %-7.2f"
	return fmt.Sprintf(" %-7d       %d            %-7s        %-7s\n", size, iters, cf(lat, 2), cf(tps, 2))
}

// Banner holds what ctx_print_test_info shows.
type Banner struct {
	Test   Test
	Role   Role
	Duplex bool   // -b: "Bidirectional", and both depths shown
	Atomic string // atomic tests: "CMP_AND_SWAP" or "FETCH_AND_ADD"
	Device string // e.g. "rxe1"
	QPs    int
	// Transport ("IB" for every verbs device, RoCE included), Connection
	// ("RC", "UC", "UD"), LinkType ("Ethernet" or "IB").
	Transport, Connection, LinkType string
	SRQ                             bool
	PCIeRelaxOrder                  string // "ON", "OFF" or "Unsupported"
	NewPostSend                     bool   // "ibv_wr* API" (ON unless --use_old_post_send)
	TXDepth, RXDepth, CQModeration  int
	MTU                             MTU
	GIDIndex                        int // -1: not printed
	InlineSize                      int // WRITE/SEND tests
	OutReads                        int // READ/atomic tests
}

// String renders the banner: ResultLine, the title, the parameter lines and
// ResultLine again.
func (b *Banner) String() string {
	var s strings.Builder
	s.WriteString(ResultLine)
	s.WriteString("                    ")
	switch b.Test {
	case SendBW, SendLat:
		s.WriteString("Send ")
	case WriteBW, WriteLat:
		s.WriteString("RDMA_Write ")
	case ReadBW, ReadLat:
		s.WriteString("RDMA_Read ")
	case AtomicBW, AtomicLat:
		s.WriteString("Atomic ")
		s.WriteString(b.Atomic + " ")
	}
	if b.Test.BW() {
		if b.Duplex {
			s.WriteString("Bidirectional ")
		}
		s.WriteString("BW ")
	} else {
		s.WriteString("Latency ")
	}
	s.WriteString("Test\n")
	fmt.Fprintf(&s, " Dual-port       : %s\t\tDevice         : %s\n", "OFF", b.Device)
	fmt.Fprintf(&s, " Number of qps   : %d\t\tTransport type : %s\n", b.QPs, b.Transport)
	fmt.Fprintf(&s, " Connection type : %s\t\tUsing SRQ      : %s\n", b.Connection, onOff(b.SRQ))
	fmt.Fprintf(&s, " PCIe relax order: %s\n", b.PCIeRelaxOrder)
	fmt.Fprintf(&s, " ibv_wr* API     : %s\n", onOff(b.NewPostSend))
	if b.Role == Client || b.Duplex {
		fmt.Fprintf(&s, " TX depth        : %d\n", b.TXDepth)
	}
	if b.Test.Send() && (b.Role == Server || b.Duplex) {
		fmt.Fprintf(&s, " RX depth        : %d\n", b.RXDepth)
	}
	if b.Test.BW() {
		fmt.Fprintf(&s, " CQ Moderation   : %d\n", b.CQModeration)
	}
	fmt.Fprintf(&s, " Mtu             : %d[B]\n", b.MTU.Bytes())
	fmt.Fprintf(&s, " Link type       : %s\n", b.LinkType)
	if b.GIDIndex >= 0 {
		fmt.Fprintf(&s, " GID index       : %d\n", b.GIDIndex)
	}
	switch b.Test {
	case ReadBW, ReadLat, AtomicBW, AtomicLat:
		fmt.Fprintf(&s, " Outstand reads  : %d\n", b.OutReads)
	default:
		fmt.Fprintf(&s, " Max inline data : %d[B]\n", b.InlineSize)
	}
	s.WriteString(" rdma_cm QPs\t : OFF\n")
	s.WriteString(" Data ex. method : Ethernet\n")
	s.WriteString(ResultLine)
	return s.String()
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

// WaitingBanner is what a server prints before accepting (FULL_VERBOSITY).
const WaitingBanner = "\n************************************\n* Waiting for client to connect... *\n************************************\n"

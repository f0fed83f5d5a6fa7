// Package decode is `softroce decode`: print the RoCEv2 packets of a pcap or pcapng file, one line
// (or one JSON object) per packet, with an ICRC check (IBTA A17.3.3). See
// docs/decode.md for the output formats.
package decode

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/spf13/pflag"

	"github.com/softroce/softroce/internal/tools/cli"
)

// Command is `softroce decode`.
var Command = cli.Command{
	Name:    "decode",
	Summary: "print the RoCEv2 packets of a pcap/pcapng file (--json: one object per line)",
	Main:    Main,
}

// Config is a parsed decode command line.
type Config struct {
	// Path is the capture file (pcap or pcapng).
	Path string
	// JSON prints one object per packet per line instead of one text line.
	JSON bool
}

// decodeOptions is the name the decoder uses for Config.
type decodeOptions = Config

func newFlagSet(c *Config) *pflag.FlagSet {
	fs := cli.NewFlagSet("decode")
	fs.BoolVarP(&c.JSON, "json", "j", false, "one JSON object per packet per line (docs/decode.md has the schema)")
	return fs
}

// Usage writes the command's usage and options.
func Usage(w io.Writer) {
	fmt.Fprint(w, "usage: softroce decode [--json] FILE.pcap|FILE.pcapng   (-- before a file name starting with -)\n\nOptions:\n")
	cli.PrintFlags(w, newFlagSet(&Config{}))
}

// ParseArgs parses "[--json] FILE" (GNU getopt style, cli.NewFlagSet).
func ParseArgs(args []string) (Config, error) {
	var c Config
	fs := newFlagSet(&c)
	if err := cli.Parse(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() != 1 {
		return c, fmt.Errorf("%w: name one capture file", cli.ErrUsage)
	}
	c.Path = fs.Arg(0)
	return c, nil
}

// Main is the command: exit status 0, 2 for a bad command line or a capture that cannot be
// read to its end.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args)
	if errors.Is(err, pflag.ErrHelp) {
		Usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "softroce decode: %v\n", err)
		Usage(stderr)
		return 2
	}
	if err := Run(ctx, c, stdout); err != nil {
		fmt.Fprintf(stderr, "softroce decode: %v\n", err)
		return 2
	}
	return 0
}

// Run decodes the capture c names, writing one line (or JSON object) per packet and the
// summary to out.
func Run(_ context.Context, c Config, out io.Writer) error {
	f, err := os.Open(c.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(out)
	defer w.Flush()
	if err := decodeStream(f, w, c); err != nil {
		w.Flush()
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	return nil
}

// Link types (https://www.tcpdump.org/linktypes.html).
const (
	linkTypeEthernet = 1
	linkTypeRawBSD   = 12  // DLT_RAW on most BSDs
	linkTypeRawOBSD  = 14  // DLT_RAW on OpenBSD
	linkTypeRaw      = 101 // LINKTYPE_RAW
	linkTypeLinuxSLL = 113 // LINKTYPE_LINUX_SLL
	linkTypeIPv4     = 228 // LINKTYPE_IPV4
	linkTypeIPv6     = 229 // LINKTYPE_IPV6
	linkTypeLinuxSL2 = 276 // LINKTYPE_LINUX_SLL2
)

// linkDecoder returns the gopacket decoder for a capture link type.
func linkDecoder(lt uint32) (gopacket.Decoder, error) {
	switch lt {
	case linkTypeEthernet:
		return layers.LayerTypeEthernet, nil
	case linkTypeRaw, linkTypeRawBSD, linkTypeRawOBSD:
		return gopacket.DecodeFunc(decodeRawIP), nil
	case linkTypeIPv4:
		return layers.LayerTypeIPv4, nil
	case linkTypeIPv6:
		return layers.LayerTypeIPv6, nil
	case linkTypeLinuxSLL:
		return layers.LayerTypeLinuxSLL, nil
	case linkTypeLinuxSL2:
		return layers.LayerTypeLinuxSLL2, nil
	}
	return nil, fmt.Errorf("unsupported link type %d", lt)
}

// decodeRawIP decodes a raw IP packet by its version nibble.
func decodeRawIP(data []byte, p gopacket.PacketBuilder) error {
	if len(data) == 0 {
		return errors.New("empty raw IP packet")
	}
	switch data[0] >> 4 {
	case 4:
		return layers.LayerTypeIPv4.Decode(data, p)
	case 6:
		return layers.LayerTypeIPv6.Decode(data, p)
	}
	return fmt.Errorf("raw IP packet with version %d", data[0]>>4)
}

// decodeSummary counts what decodeStream saw.
type decodeSummary struct {
	roce, icrcOK, icrcBad, icrcRxeFlush, malformed, other int
}

func decodeStream(r io.Reader, w io.Writer, o decodeOptions) error {
	src, err := newCaptureReader(r)
	if err != nil {
		return err
	}
	if lt, ok := src.fileLinkType(); ok {
		if _, err := linkDecoder(lt); err != nil {
			return err
		}
	}
	var sum decodeSummary
	enc := json.NewEncoder(w)
	for frame := 1; ; frame++ {
		data, lt, err := src.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("frame %d: %v", frame, err)
		}
		dec, err := linkDecoder(lt)
		if err != nil {
			return fmt.Errorf("frame %d: %v", frame, err)
		}
		pkt := gopacket.NewPacket(data, dec, gopacket.DecodeOptions{NoCopy: true})
		rec, derr := decodeFrame(pkt, frame)
		switch {
		case rec == nil:
			sum.other++
			continue
		case derr != nil:
			sum.malformed++
			if !o.JSON {
				fmt.Fprintf(w, "%d %s > %s malformed RoCE: %v\n", frame,
					hostPort(rec.Src, rec.Sport), hostPort(rec.Dst, rec.Dport), derr)
			}
			continue
		}
		sum.roce++
		if rec.ICRCOK {
			sum.icrcOK++
		} else if rec.ICRCVariant != "" {
			sum.icrcRxeFlush++
		} else {
			sum.icrcBad++
		}
		if o.JSON {
			if err := enc.Encode(rec); err != nil {
				return err
			}
		} else {
			writeText(w, rec)
		}
	}
	if !o.JSON {
		variant := ""
		if sum.icrcRxeFlush > 0 {
			variant = fmt.Sprintf(", rxe FLUSH ICRC %d", sum.icrcRxeFlush)
		}
		fmt.Fprintf(w, "# %d RoCE packets (ICRC ok %d, bad %d%s), %d malformed, %d other frames\n",
			sum.roce, sum.icrcOK, sum.icrcBad, variant, sum.malformed, sum.other)
	}
	return nil
}

package main

// softroce stats --daemon SOCKET: live counters of a running daemon. This
// file wraps the stats command registered by stats.go (which it does not
// edit): arguments with --daemon are served here, all others go to
// stats.go's runStats unchanged.

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/softroce/softroce/pkg/client"
)

func init() {
	c, ok := commands["stats"]
	if !ok {
		return
	}
	base := c.run
	c.summary += "; --daemon SOCKET: live, from a running daemon"
	c.run = func(args []string, stdout, stderr io.Writer) int {
		for _, a := range args {
			if a == "--daemon" || a == "-daemon" || strings.HasPrefix(a, "--daemon=") || strings.HasPrefix(a, "-daemon=") {
				return runStatsDaemon(args, stdout, stderr)
			}
		}
		return base(args, stdout, stderr)
	}
}

func runStatsDaemon(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sock := fs.String("daemon", client.DefaultSocket, "the daemon's unix socket")
	pretty := fs.Bool("p", false, "one counter per line")
	asJSON := fs.Bool("json", false, "print the snapshots as JSON")
	interval := fs.Duration("interval", time.Second, "time between snapshots")
	count := fs.Int("count", 1, "number of snapshots (0 = until interrupted)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *interval <= 0 || *count < 0 {
		fmt.Fprintln(stderr, "stats: -interval must be > 0 and -count >= 0")
		return 2
	}
	c, err := client.Dial(*sock)
	if err != nil {
		fmt.Fprintf(stderr, "stats: %v\n", err)
		return 1
	}
	defer c.Close()
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			<-tick.C
		}
		if _, err := c.Debug(); err != nil { // liveness: the daemon is still there
			fmt.Fprintf(stderr, "stats: %v\n", err)
			return 1
		}
		s := StatsSnapshot{Device: c.Name(), Port: 1, Time: time.Now().UTC(), Counters: c.Stats().Map()}
		if *asJSON {
			b, _ := json.Marshal(s)
			fmt.Fprintln(stdout, string(b))
			continue
		}
		printStats(stdout, s, *pretty)
	}
	return 0
}

package layout

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// trackedFiles returns the repository's tracked files (git ls-files), relative to the
// repository root, and that root. The test is skipped outside a git checkout (a module copy
// from the proxy has no history to keep out of it).
func trackedFiles(t *testing.T) (root string, files []string) {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	root = strings.TrimSpace(string(out))
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	if len(files) < 100 {
		t.Fatalf("git ls-files lists %d files", len(files))
	}
	return root, files
}

// recorded reports whether a tracked file is recorded data rather than prose or code: test
// data (captures, fuzz corpora, tool outputs kept as references), checksums, profiles. Their
// bytes are what a tool wrote, so "#3" there is a packet number, not a reference.
func recorded(path string) bool {
	for _, seg := range strings.Split(filepath.ToSlash(path), "/") {
		if seg == "testdata" {
			return true
		}
	}
	switch filepath.Base(path) {
	case "go.sum", "default.pgo":
		return true
	}
	return false
}

// The history and the build machine stay out of the tree (docs, code, comments, scripts):
// git keeps the history, and a reader of the product needs neither issue numbers nor the
// paths of the machine it was built on. The patterns are written so that this file does not
// match them.
var treeRules = []struct {
	what string
	re   *regexp.Regexp
	md   bool // only in Markdown files
}{
	{"an issue number", regexp.MustCompile(`(?i)\bissues?\s+#?\d+\b`), false},
	{"an issue number", regexp.MustCompile(`(?:^|[\s(\[,;])#\d+\b`), false},
	{"session talk", regexp.MustCompile(`(?i)\bthis\s+session\b`), false},
	{"session talk", regexp.MustCompile(`(?i)\bother\s+engineers?\b`), false},
	{"a path of the build machine", regexp.MustCompile(`(?:^|[^\w.])/(?:work|root)/`), false},
	{"a path of the build machine", regexp.MustCompile(`(?:^|[^\w.])/tmp/`), true},
	{"a commit hash", regexp.MustCompile(`(?i)\b(?:commit|main at|builds? of|built from)\s+[0-9a-f]{7,40}\b|\b[0-9a-f]{7,12}\^`), false},
	{"a date", regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`), false},
	{"a time of day", regexp.MustCompile(`\b[0-2]?\d:[0-5]\d(?:-[0-2]?\d:[0-5]\d)?\s+UTC\b`), false},
}

// TestTreeHasNoHistory: no tracked file names an issue, a working session, a date or a path
// of the build machine (DEVELOPERS.md, "Rules"). CHANGELOG.md may date its versions.
func TestTreeHasNoHistory(t *testing.T) {
	root, files := trackedFiles(t)
	for _, f := range files {
		if recorded(f) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree, not yet committed
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(b, 0) >= 0 {
			continue // binary
		}
		md := strings.HasSuffix(f, ".md")
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			for _, r := range treeRules {
				if r.md && !md {
					continue
				}
				if r.what == "a date" && f == "CHANGELOG.md" {
					continue
				}
				if m := r.re.FindString(line); m != "" {
					t.Errorf("%s:%d: %s (%q): %s", f, n, r.what, strings.TrimSpace(m), clip(line))
				}
			}
		}
	}
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// maxLines is the length past which a Go file must say why it is long (DEVELOPERS.md,
// "Rules").
const maxLines = 600

// longReason is the comment a long file carries in its first lines: "// Long file: " and a
// reason of a sentence or more.
var longReason = regexp.MustCompile(`^// Long file: (.{40,})`)

// TestFileLength: every non-test, non-generated Go file is at most maxLines long, or says in a
// "// Long file: REASON" comment within its first 30 lines why it is one file.
func TestFileLength(t *testing.T) {
	root, files := trackedFiles(t)
	for _, f := range files {
		if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") || recorded(f) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n") // a final newline leaves an empty last element
		generated, reason := false, false
		for _, l := range lines[:min(30, len(lines))] {
			if strings.HasPrefix(l, "// Code generated ") && strings.HasSuffix(l, " DO NOT EDIT.") {
				generated = true // the Go convention (go help generate)
			}
			if longReason.MatchString(l) {
				reason = true
			}
		}
		if reason && len(lines) <= maxLines+1 {
			t.Errorf("%s: %d lines carries a \"// Long file:\" comment: no longer needed, remove it", f, len(lines)-1)
		}
		if len(lines) <= maxLines+1 {
			continue
		}
		if !generated && !reason {
			t.Errorf("%s: %d lines (over %d): split it, or say why it is one file in a \"// Long file: REASON\" comment in its first 30 lines", f, len(lines)-1, maxLines)
		}
	}
}

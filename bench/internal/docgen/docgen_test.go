package docgen

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplace(t *testing.T) {
	begin, end := Markers("bench/x.sh")
	doc := filepath.Join(t.TempDir(), "page.md")
	page := "# Page\n\nbefore\n" + begin + "\nold table\n" + end + "\nafter\n"
	if err := os.WriteFile(doc, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Replace(doc, "bench/x.sh", func(w io.Writer) { io.WriteString(w, "| new |\n") }); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(doc)
	want := "# Page\n\nbefore\n" + begin + "\n| new |\n" + end + "\nafter\n"
	if string(got) != want {
		t.Fatalf("page:\n%s\nwant:\n%s", got, want)
	}
	// another tool's markers, or none: an error, the page untouched
	for _, tool := range []string{"bench/y.sh", ""} {
		if err := Replace(doc, tool, func(w io.Writer) { io.WriteString(w, "x") }); err == nil || !strings.Contains(err.Error(), "markers") {
			t.Fatalf("%q: %v", tool, err)
		}
	}
	if again, _ := os.ReadFile(doc); string(again) != want {
		t.Fatalf("a failed Replace changed the page:\n%s", again)
	}
}

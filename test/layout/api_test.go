package layout

import (
	"bufio"
	"bytes"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// engineHooks are the exported methods and fields of the public packages whose types are
// the engine's own and deliberately have no public name: they exist for softroce's own
// daemon, tools and conformance bench, and a program using the verbs API has no need of
// them. The walk of the public API does not enter them.
var engineHooks = map[string]string{
	"roce.Device.CM":                "the device's IB CM on QP1; programs connect with pkg/rdmacm",
	"roce.Device.SetCMEventHandler": "the CM's events, for pkg/rdmacm",
	"roce.Device.MRTable":           "the engine's MR table (memory windows, fast registration), for the daemon",
	"roce.Device.RegMemory":         "memory the engine reaches by copying (a client process's, through its mem file), for the daemon",
	"roce.QP.QP":                    "the engine QP a roce.QP embeds; its verbs are the QueuePair methods",
	"cq.CQ.SetOnPush":               "the daemon's hook into completion delivery",
	"cq.CQ.SetPushHooks":            "the daemon's hook into completion delivery",
	"mr.MR.DeregWith":               "the daemon's bounded deregistration",
	"mr.MR.ReregWith":               "the daemon's re-registration over copied memory, bounded",
	"mr.MR.FastReg":                 "fast registration, posted by the engine",
	"mr.MR.State":                   "the key state, for the engine",
	"qp.DeviceAttr.TableOptions":    "the MR table's limits, for the engine",
	"qp.SRQ.Take":                   "the engine's receive path",
}

// exportData maps the import path of every package the public packages depend on to its
// compiled export data (go list -export).
func exportData(t *testing.T) (map[string]string, []string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-export", "-f", "{{.ImportPath}} {{.Export}} {{.Standard}}", module+"pkg/...").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	files := map[string]string{}
	var public []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		files[f[0]] = f[1]
		if strings.HasPrefix(f[0], module+"pkg/") {
			public = append(public, f[0])
		}
	}
	return files, public
}

// TestPublicAPINames: every type of internal/ that the public packages' exported API
// shows (a parameter, result, field or method of it, followed transitively) has a public
// name, an alias in a public package, so a program never imports an internal package to
// use the API; and a public alias of a type brings all the type's constants.
func TestPublicAPINames(t *testing.T) {
	files, public := exportData(t)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	// the internal packages first, each from its own export data: a package imported only
	// as a dependency holds just the objects its importer's export data mentions
	for path := range files {
		if strings.HasPrefix(path, module+"internal/") {
			if _, err := imp.Import(path); err != nil {
				t.Fatal(err)
			}
		}
	}
	var pkgs []*types.Package
	for _, p := range public {
		pkg, err := imp.Import(p)
		if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, pkg)
	}

	// the public names of internal types: aliases declared in public packages
	named := map[*types.TypeName][]string{}
	for _, pkg := range pkgs {
		for _, n := range pkg.Scope().Names() {
			o, ok := pkg.Scope().Lookup(n).(*types.TypeName)
			if !ok || !o.Exported() || !o.IsAlias() {
				continue
			}
			if nt, ok := types.Unalias(o.Type()).(*types.Named); ok {
				named[nt.Obj()] = append(named[nt.Obj()], pkg.Name()+"."+n)
			}
		}
	}

	internal := func(o *types.TypeName) bool {
		return o.Pkg() != nil && strings.HasPrefix(o.Pkg().Path(), module+"internal/")
	}
	seen := map[*types.TypeName]bool{}
	hooked := map[string]bool{} // engineHooks met on the walk
	hook := func(name string) bool {
		if engineHooks[name] == "" {
			return false
		}
		hooked[name] = true
		return true
	}
	missing := map[string]string{} // internal type -> where the API shows it
	var walk func(typ types.Type, at string)
	walkNamed := func(n *types.Named, at string) {
		o := n.Obj()
		if o.Pkg() == nil || !strings.HasPrefix(o.Pkg().Path(), module) {
			return
		}
		if internal(o) && len(named[o]) == 0 {
			key := o.Pkg().Name() + "." + o.Name()
			if _, ok := missing[key]; !ok {
				missing[key] = at
			}
		}
		if seen[o] {
			return
		}
		seen[o] = true
		self := o.Pkg().Name() + "." + o.Name()
		walk(n.Underlying(), self)
		ms := types.NewMethodSet(types.NewPointer(n))
		for i := 0; i < ms.Len(); i++ {
			m := ms.At(i).Obj()
			if !m.Exported() {
				continue
			}
			if len(ms.At(i).Index()) > 1 { // promoted from an embedded field
				if f := embeddedVia(n, ms.At(i).Index()[0]); f != "" && hook(self+"."+f) {
					continue
				}
			}
			if hook(self + "." + m.Name()) {
				continue
			}
			walk(m.Type(), self+"."+m.Name())
		}
	}
	walk = func(typ types.Type, at string) {
		switch x := typ.(type) {
		case *types.Alias:
			walk(types.Unalias(x), at)
		case *types.Named:
			walkNamed(x, at)
		case *types.Pointer:
			walk(x.Elem(), at)
		case *types.Slice:
			walk(x.Elem(), at)
		case *types.Array:
			walk(x.Elem(), at)
		case *types.Map:
			walk(x.Key(), at)
			walk(x.Elem(), at)
		case *types.Chan:
			walk(x.Elem(), at)
		case *types.Signature:
			for i := 0; i < x.Params().Len(); i++ {
				walk(x.Params().At(i).Type(), at)
			}
			for i := 0; i < x.Results().Len(); i++ {
				walk(x.Results().At(i).Type(), at)
			}
		case *types.Struct:
			for i := 0; i < x.NumFields(); i++ {
				f := x.Field(i)
				if !f.Exported() || hook(at+"."+f.Name()) {
					continue
				}
				walk(f.Type(), at+"."+f.Name())
			}
		case *types.Interface:
			for i := 0; i < x.NumMethods(); i++ {
				if m := x.Method(i); m.Exported() {
					walk(m.Type(), at+"."+m.Name())
				}
			}
		}
	}
	for _, pkg := range pkgs {
		for _, n := range pkg.Scope().Names() {
			if o := pkg.Scope().Lookup(n); o.Exported() {
				walk(o.Type(), pkg.Name()+"."+n)
			}
		}
	}
	for h := range engineHooks {
		if !hooked[h] {
			t.Errorf("engineHooks lists %s, which the public API no longer shows: remove it", h)
		}
	}
	var miss []string
	for k, at := range missing {
		miss = append(miss, fmt.Sprintf("%s (shown by %s)", k, at))
	}
	sort.Strings(miss)
	for _, m := range miss {
		t.Errorf("internal type without a public name: %s", m)
	}

	// an alias brings the constants of its type: every exported constant of an aliased
	// internal type has a constant of the same value in the alias's package
	for o, aliases := range named {
		if !internal(o) {
			continue
		}
		for _, alias := range aliases {
			pub := pkgOf(pkgs, alias)
			have := map[string]bool{}
			for _, n := range pub.Scope().Names() {
				if c, ok := pub.Scope().Lookup(n).(*types.Const); ok && types.Identical(c.Type(), o.Type()) {
					have[c.Val().ExactString()] = true
				}
			}
			for _, n := range o.Pkg().Scope().Names() {
				c, ok := o.Pkg().Scope().Lookup(n).(*types.Const)
				if !ok || !c.Exported() || !types.Identical(c.Type(), o.Type()) {
					continue
				}
				if !have[c.Val().ExactString()] {
					t.Errorf("%s aliases %s.%s but has no constant for %s.%s", alias, o.Pkg().Name(), o.Name(), o.Pkg().Name(), n)
				}
			}
		}
	}
	if len(named) < 20 {
		t.Errorf("only %d public aliases of internal types found", len(named))
	}
}

// embeddedVia names the embedded field at index i of the struct under n ("" if none).
func embeddedVia(n *types.Named, i int) string {
	s, ok := n.Underlying().(*types.Struct)
	if !ok || i >= s.NumFields() || !s.Field(i).Embedded() {
		return ""
	}
	return s.Field(i).Name()
}

// pkgOf returns the package of a "name.Ident" alias among pkgs.
func pkgOf(pkgs []*types.Package, alias string) *types.Package {
	name, _, _ := strings.Cut(alias, ".")
	for _, p := range pkgs {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

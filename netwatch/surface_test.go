package netwatch_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// surface counts a package's exported API as go doc lists it: types,
// functions (constructors included), methods, constants and variables, one
// per name, and, apart, the exported fields of exported struct types. Test
// files do not count.
func surface(t *testing.T, dir string) (idents, fields int) {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	dp, err := doc.NewFromFiles(fset, files, "x")
	if err != nil {
		t.Fatal(err)
	}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, n := range v.Names {
				if token.IsExported(n) {
					idents++
				}
			}
		}
	}
	values(dp.Consts)
	values(dp.Vars)
	idents += len(dp.Funcs)
	for _, typ := range dp.Types {
		idents += 1 + len(typ.Funcs) + len(typ.Methods)
		values(typ.Consts)
		values(typ.Vars)
		for _, s := range typ.Decl.Specs {
			st, ok := s.(*ast.TypeSpec).Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, f := range st.Fields.List {
				for _, n := range f.Names {
					if n.IsExported() {
						fields++
					}
				}
			}
		}
	}
	return idents, fields
}

// TestSurface holds the library to the size its users were promised
// (issue 24): no package above 150 identifiers, the cache and the
// reconciler together at most 220, the test kit at most 100. What is
// exported must earn its place; this says when something new pushes
// something out. netwatch is back at 150 (issue 37): RouteSet (issue 31)
// added six identifiers; Op.DescribeWhole, Watcher.Synced and
// View.RouteCount, each a second way to do one thing, went, then
// View.Mark (Changes returns the next mark), Addr.Usable (SourceAddrs
// applies it), Attrs.Each (netlink's AttributeDecoder reads Attrs) and
// LockMTU (1<<unix.RTAX_MTU). The limits only come down.
func TestSurface(t *testing.T) {
	nw, nwf := surface(t, ".")
	rc, rcf := surface(t, "reconcile")
	kit, kitf := surface(t, "netwatchtest")
	pr, prf := surface(t, "program")
	t.Logf("netwatch %d (+%d fields), reconcile %d (+%d), netwatchtest %d (+%d), program %d (+%d)", nw, nwf, rc, rcf, kit, kitf, pr, prf)
	for _, c := range []struct {
		what     string
		n, limit int
	}{
		{"netwatch", nw, 150},
		{"netwatch/reconcile", rc, 150},
		{"netwatch and netwatch/reconcile", nw + rc, 220},
		{"netwatch/netwatchtest", kit, 100},
		{"netwatch/program", pr, 30},
	} {
		if c.n > c.limit {
			t.Errorf("%s exports %d identifiers, more than %d", c.what, c.n, c.limit)
		}
	}
}

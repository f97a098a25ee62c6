// Package docs holds the test that keeps the documentation true to the
// code: the identifiers doc comments and the Markdown name, the metrics
// they name, and the messages they quote.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The packages whose doc comments are checked, and whose identifiers a
// doc may name qualified by the package's name.
var packageDirs = []string{
	"../netwatch", "../netwatch/reconcile", "../netwatch/program", "../netwatch/netwatchtest", "../mtupolicy", "../agent",
	"../examples/uplinkpin", "../examples/vpnbypass", "../examples/watch",
	"../internal/metricsserver", "../netwatch/internal/rtnl",
}

// The Markdown checked.
var markdown = []string{"../README.md", "design.md", "operations.md"}

// syms is what a package declares: its top-level names, and the methods
// and fields of each of its types (embedded types by their names, in
// embeds).
type syms struct {
	name    string
	top     map[string]bool
	members map[string]map[string]bool
	embeds  map[string][]string
	docs    []*ast.CommentGroup
	strs    []string // string literals
	tests   []string // the test files' functions
}

func parseDir(t *testing.T, dir string) *syms {
	t.Helper()
	s := &syms{top: map[string]bool{}, members: map[string]map[string]bool{}, embeds: map[string][]string{}}
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("%s: no Go files (%v)", dir, err)
	}
	fset := token.NewFileSet()
	member := func(typ, m string) {
		if s.members[typ] == nil {
			s.members[typ] = map[string]bool{}
		}
		s.members[typ][m] = true
	}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			// Tests, benchmarks and examples may be named; the doc
			// comments of examples are what go doc shows.
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
					s.tests = append(s.tests, fd.Name.Name)
					if strings.HasPrefix(filepath.Base(name), "example") && fd.Doc != nil {
						s.docs = append(s.docs, fd.Doc)
					}
				}
			}
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		s.name = f.Name.Name
		if f.Doc != nil {
			s.docs = append(s.docs, f.Doc)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					if v, err := strconv.Unquote(n.Value); err == nil {
						s.strs = append(s.strs, v)
					}
				}
			case *ast.Field:
				if n.Doc != nil {
					s.docs = append(s.docs, n.Doc)
				}
			case *ast.GenDecl:
				if n.Doc != nil {
					s.docs = append(s.docs, n.Doc)
				}
			case *ast.ValueSpec:
				if n.Doc != nil {
					s.docs = append(s.docs, n.Doc)
				}
			case *ast.TypeSpec:
				if n.Doc != nil {
					s.docs = append(s.docs, n.Doc)
				}
			}
			return true
		})
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Doc != nil {
					s.docs = append(s.docs, d.Doc)
				}
				if d.Recv == nil {
					s.top[d.Name.Name] = true
					continue
				}
				typ := d.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					member(id.Name, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							s.top[n.Name] = true
						}
					case *ast.TypeSpec:
						s.top[sp.Name.Name] = true
						var fields *ast.FieldList
						switch tt := sp.Type.(type) {
						case *ast.StructType:
							fields = tt.Fields
						case *ast.InterfaceType:
							fields = tt.Methods
						}
						if fields == nil {
							continue
						}
						for _, f := range fields.List {
							for _, n := range f.Names {
								member(sp.Name.Name, n.Name)
							}
							if len(f.Names) == 0 {
								e := f.Type
								if st, ok := e.(*ast.StarExpr); ok {
									e = st.X
								}
								switch e := e.(type) {
								case *ast.Ident:
									s.embeds[sp.Name.Name] = append(s.embeds[sp.Name.Name], e.Name)
									member(sp.Name.Name, e.Name)
								case *ast.SelectorExpr:
									s.embeds[sp.Name.Name] = append(s.embeds[sp.Name.Name], e.Sel.Name)
									member(sp.Name.Name, e.Sel.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	return s
}

// has reports whether typ has member m, itself or through an embedded type.
func (s *syms) has(typ, m string, depth int) bool {
	if s.members[typ][m] {
		return true
	}
	if depth > 3 {
		return false
	}
	for _, e := range s.embeds[typ] {
		if s.has(e, m, depth+1) {
			return true
		}
	}
	return false
}

type world struct {
	pkgs   []*syms
	byName map[string]*syms
	all    map[string]bool // every name declared anywhere: top-level, method, field
	strs   string          // every string literal, NUL-separated
}

func load(t *testing.T) *world {
	w := &world{byName: map[string]*syms{}, all: map[string]bool{}}
	var strs []string
	for _, dir := range packageDirs {
		s := parseDir(t, dir)
		w.pkgs = append(w.pkgs, s)
		if s.name != "main" {
			w.byName[s.name] = s
		}
		for n := range s.top {
			w.all[n] = true
		}
		for _, n := range s.tests {
			w.all[n] = true
		}
		for _, ms := range s.members {
			for m := range ms {
				w.all[m] = true
			}
		}
		strs = append(strs, s.strs...)
	}
	for _, dir := range []string{"../internal"} {
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				if gs, _ := filepath.Glob(filepath.Join(path, "*.go")); len(gs) > 0 {
					strs = append(strs, parseDir(t, path).strs...)
				}
			}
			return nil
		})
	}
	w.strs = strings.Join(strs, "\x00")
	return w
}

// chainRE finds Name.Name[.Name] in prose; camelRE a bare identifier of
// two humps or more (ConnectedRoutes, NetNS), not an acronym with digits
// (IPv4).
var (
	chainRE = regexp.MustCompile(`\b([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Z][A-Za-z0-9_]*)+)\b`)
	camelRE = regexp.MustCompile(`(?:^|[\s(,"'` + "`" + `])([A-Z][a-z]+[A-Z][A-Za-z]*)\b`)
)

// resolve reports whether the chain first.rest names something that
// exists, and whether it was checked at all (a standard library name, a
// variable's field, a file name are not).
func (w *world) resolve(in *syms, first string, rest []string) (ok, checked bool) {
	if p := w.byName[first]; p != nil {
		if !p.top[rest[0]] {
			return false, true
		}
		if len(rest) > 1 {
			return p.has(rest[0], rest[1], 0), true
		}
		return true, true
	}
	if first == "" || first[0] < 'A' || first[0] > 'Z' {
		return false, false
	}
	// A type: the current package's, else any of these packages'.
	if in != nil && in.top[first] {
		return in.has(first, rest[0], 0), true
	}
	for _, p := range w.pkgs {
		if p.top[first] && p.has(first, rest[0], 0) {
			return true, true
		}
	}
	for _, p := range w.pkgs {
		if p.top[first] {
			return false, true
		}
	}
	return false, false
}

// TestDocIdentifiers: every identifier a doc comment names as
// Type.Method, Type.Field or pkg.Name, and every bare identifier of two
// humps or more, exists.
func TestDocIdentifiers(t *testing.T) {
	w := load(t)
	check := func(where string, in *syms, text string) {
		for _, m := range chainRE.FindAllStringSubmatch(text, -1) {
			rest := strings.Split(strings.TrimPrefix(m[2], "."), ".")
			if ok, checked := w.resolve(in, m[1], rest); checked && !ok {
				t.Errorf("%s names %s, which does not exist", where, m[0])
			}
		}
		for _, m := range camelRE.FindAllStringSubmatch(text, -1) {
			if !w.all[m[1]] && !prose[m[1]] {
				t.Errorf("%s names %s, which does not exist", where, m[1])
			}
		}
	}
	for i, p := range w.pkgs {
		for _, d := range p.docs {
			check(packageDirs[i]+" (doc comment)", p, d.Text())
			// A list of identifiers ("OwnTable, OwnPriority and
			// MarkMask") names things that exist, and one that names
			// any of its package's types names only those: a bare
			// Table there would be netwatch's, which it does not mean.
			for _, m := range listRE.FindAllString(d.Text(), -1) {
				var names []string
				own := false
				for _, n := range strings.FieldsFunc(m, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' }) {
					if n != "and" && n != "or" && !prose[n] {
						names, own = append(names, n), own || p.top[n]
					}
				}
				for _, n := range names {
					if !w.all[n] || own && !p.top[n] {
						t.Errorf("%s (doc comment) names %s in %q, which does not exist", packageDirs[i], n, m)
					}
				}
			}
		}
	}
	for _, md := range markdown {
		data, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		// Only what is quoted as code: `netwatch.Watcher`, `Op.Describe`.
		for _, q := range codeRE.FindAllStringSubmatch(string(data), -1) {
			for _, m := range chainRE.FindAllStringSubmatch(q[1], -1) {
				rest := strings.Split(strings.TrimPrefix(m[2], "."), ".")
				if ok, checked := w.resolve(nil, m[1], rest); checked && !ok {
					t.Errorf("%s names %s, which does not exist", md, m[0])
				}
			}
		}
	}
}

// prose are words of two humps that are not identifiers: names of things
// outside the code.
var prose = map[string]bool{
	"CiliumNode": true, "CiliumNodes": true, "DaemonSet": true, "ConfigMap": true, "WireGuard": true, "NetworkManager": true,
	"InternalIP": true, "InternalIPs": true, "ServiceAccount": true, "ClusterRole": true, "PodSecurity": true,
	"KiB": true, "MiB": true, "GiB": true,
	"InDestUnreachs": true, "InPktTooBigs": true,
	// Other modules' identifiers, named bare.
	"FlagSet": true, "AddressMessage": true, "RouteMessage": true, "LinkMessage": true, "RuleMessage": true,
}

// listRE finds a list of three or more capitalised words ("Table,
// Priority, MarkMask and Protocol").
var listRE = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*(?:,\s+[A-Z][A-Za-z0-9]*)+,?\s+(?:and|or)\s+[A-Z][A-Za-z0-9]*\b`)

var codeRE = regexp.MustCompile("`([^`\n]+)`")

// metricRE finds a metric name; one that ends in _ is a prefix
// (marksplit_host_ip_frag_(oks|creates)_total).
var metricRE = regexp.MustCompile(`marksplit_[a-z0-9_]+`)

// TestDocMetrics: every metric the docs (Markdown and the agent's doc
// comments) name is one the agent serves, as its golden /metrics lists it.
func TestDocMetrics(t *testing.T) {
	data, err := os.ReadFile("../agent/testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	served := strings.Fields(string(data))
	texts := map[string]string{}
	for _, md := range append(markdown, "../charts/marksplit/README.md") {
		if b, err := os.ReadFile(md); err == nil {
			texts[md] = string(b)
		} else if !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	w := load(t)
	for i, p := range w.pkgs {
		var b strings.Builder
		for _, d := range p.docs {
			b.WriteString(d.Text())
		}
		texts[packageDirs[i]] = b.String()
	}
	for where, text := range texts {
		for _, name := range slices.Compact(slices.Sorted(slices.Values(metricRE.FindAllString(text, -1)))) {
			if notGolden[name] {
				continue
			}
			ok := slices.ContainsFunc(served, func(s string) bool {
				if strings.HasSuffix(name, "_") {
					return strings.HasPrefix(s, name)
				}
				return s == name || s == name+"_bucket" || s == name+"_count"
			})
			if !ok {
				t.Errorf("%s names %s, which the agent does not serve (agent/testdata/metrics.txt)", where, name)
			}
		}
	}
}

// notGolden are metrics the agent serves that the golden run cannot show.
var notGolden = map[string]bool{
	// Registered only with the uninstall switch, which is read only in a
	// pod (agent/uninstall_linux.go).
	"marksplit_uninstall_switch": true,
	// Registered only with --path-mtu-probe, which opens the probe sockets
	// and the responder (agent/pathprobe_linux.go); the golden run does not.
	"marksplit_path_mtu_searches_total": true,
	"marksplit_path_mtu_probes_total":   true,
}

// quoteRE finds a quoted message of one of the programs or packages:
// "netwatch: …", `reconcile: …`, `marksplit: …`.
var quoteRE = regexp.MustCompile("[\"`]((?:netwatch|reconcile|mtupolicy|netwatchtest|marksplit|uplinkpin|vpnbypass): [^\"`\n]+)[\"`]")

// fragmentRE splits a message where the code fills in values: numbers,
// quoted inputs, ellipses.
var fragmentRE = regexp.MustCompile(`[0-9]+|…|\.\.\.|%[a-z]|"[^"]*"|'[^']*'`)

// TestDocMessages: each message the docs quote comes from the code: its
// longest stretch without a value in it is in a string literal of the
// code.
func TestDocMessages(t *testing.T) {
	w := load(t)
	texts := map[string]string{}
	for _, md := range markdown {
		b, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		texts[md] = string(b)
	}
	for i, p := range w.pkgs {
		var b strings.Builder
		for _, d := range p.docs {
			b.WriteString(d.Text())
		}
		texts[packageDirs[i]] = b.String()
	}
	n := 0
	for where, text := range texts {
		for _, q := range quoteRE.FindAllStringSubmatch(text, -1) {
			longest := ""
			for _, f := range fragmentRE.Split(q[1], -1) {
				// The program's prefix is the caller's, not the message's.
				f = strings.TrimSpace(regexp.MustCompile(`^(?:[a-z]+: )+`).ReplaceAllString(f, ""))
				if len(f) > len(longest) {
					longest = f
				}
			}
			if len(longest) < 8 {
				continue
			}
			n++
			if !strings.Contains(w.strs, longest) {
				t.Errorf("%s quotes %q: %q is in no string of the code", where, q[1], longest)
			}
		}
	}
	if n == 0 {
		t.Fatal("no quoted messages found: has the quoting changed?")
	}
}

package sandbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The boundary between the core (Manager) and Images, as the package's
// source states it: Images holds no Manager and reaches it only through
// core; no Manager method names Images (it reaches them only through the
// imageHooks seam); Images changes no box's record, session or processes
// (that is the core's, through core). NewImages, which builds one on the
// other, is the one place that names both.
func TestImagesBoundary(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var imagesFields []string
	methods := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok || ts.Name.Name != "Images" {
						continue
					}
					for _, fl := range ts.Type.(*ast.StructType).Fields.List {
						for _, n := range fl.Names {
							imagesFields = append(imagesFields, n.Name+" "+types(fl.Type))
						}
						if mentions(fl.Type, "Manager") {
							t.Errorf("%s: Images has a field of a Manager type", fset.Position(fl.Pos()))
						}
					}
				}
			case *ast.FuncDecl:
				recv := receiver(d)
				methods[recv]++
				where := fset.Position(d.Pos()).String() + " " + d.Name.Name
				switch recv {
				case "Manager":
					if mentions(d, "Images") {
						t.Errorf("%s: a Manager method names Images; the core reaches it only through imageHooks", where)
					}
				case "Images":
					if mentions(d, "Manager") {
						t.Errorf("%s: an Images method names Manager; it reaches the core only through core", where)
					}
					for _, field := range writesBox(d) {
						t.Errorf("%s: Images writes a box's %s; only the core changes sandboxes", where, field)
					}
				}
			}
		}
	}
	if !strings.Contains(strings.Join(imagesFields, ";"), "core core") {
		t.Errorf("Images does not hold the core interface: fields %v", imagesFields)
	}
	if methods["Manager"] == 0 || methods["Images"] == 0 {
		t.Errorf("methods per type: %v", methods)
	}
	t.Logf("methods per type: Manager %d, Images %d", methods["Manager"], methods["Images"])
}

// receiver is the name of fd's receiver type, "" for a function.
func receiver(fd *ast.FuncDecl) string {
	if fd.Recv == nil {
		return ""
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// mentions reports whether the identifier name occurs in n.
func mentions(n ast.Node, name string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}

// types renders a field type for a message.
func types(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return "*" + types(e.X)
	case *ast.SelectorExpr:
		return types(e.X) + "." + e.Sel.Name
	}
	return "?"
}

// writesBox returns the box fields (rec, conn, procs, dir,
// containerGone, and fields of rec) that fd assigns to.
func writesBox(fd *ast.FuncDecl) []string {
	var out []string
	ast.Inspect(fd, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok {
			return true
		}
		for _, lhs := range as.Lhs {
			for e := lhs; ; {
				sel, ok := e.(*ast.SelectorExpr)
				if !ok {
					break
				}
				switch sel.Sel.Name {
				case "rec", "conn", "procs", "dir", "containerGone":
					out = append(out, sel.Sel.Name)
				}
				e = sel.X
			}
		}
		return true
	})
	return out
}

package api_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/server"
)

// These tests keep api/openapi.yaml in step with the code: the routes of
// internal/server, the json tags of the api types and the values of their
// enumerations. They read the spec with the small YAML reader at the end of
// this file, which knows just the block style openapi.yaml is written in.

// structSchemas maps each object schema of the spec to its Go type. Every
// exported struct of package api must be here (TestSchemasCoverAPITypes).
var structSchemas = map[string]reflect.Type{
	"Error":                reflect.TypeFor[api.Error](),
	"Health":               reflect.TypeFor[api.Health](),
	"NodeInfo":             reflect.TypeFor[api.NodeInfo](),
	"PoolInfo":             reflect.TypeFor[api.PoolInfo](),
	"ClusterNode":          reflect.TypeFor[api.ClusterNode](),
	"ClusterNodeList":      reflect.TypeFor[api.ClusterNodeList](),
	"Limits":               reflect.TypeFor[api.Limits](),
	"TemplateStep":         reflect.TypeFor[api.TemplateStep](),
	"TemplateBase":         reflect.TypeFor[api.TemplateBase](),
	"RegistryAuth":         reflect.TypeFor[api.RegistryAuth](),
	"DebianBase":           reflect.TypeFor[api.DebianBase](),
	"TemplateSpec":         reflect.TypeFor[api.TemplateSpec](),
	"Sandbox":              reflect.TypeFor[api.Sandbox](),
	"CreateSandboxRequest": reflect.TypeFor[api.CreateSandboxRequest](),
	"SandboxList":          reflect.TypeFor[api.SandboxList](),
	"TimeoutRequest":       reflect.TypeFor[api.TimeoutRequest](),
	"ForkRequest":          reflect.TypeFor[api.ForkRequest](),
	"ForkResponse":         reflect.TypeFor[api.ForkResponse](),
	"Snapshot":             reflect.TypeFor[api.Snapshot](),
	"SnapshotRequest":      reflect.TypeFor[api.SnapshotRequest](),
	"SnapshotList":         reflect.TypeFor[api.SnapshotList](),
	"Volume":               reflect.TypeFor[api.Volume](),
	"CreateVolumeRequest":  reflect.TypeFor[api.CreateVolumeRequest](),
	"VolumeList":           reflect.TypeFor[api.VolumeList](),
	"VolumeMount":          reflect.TypeFor[api.VolumeMount](),
	"Usage":                reflect.TypeFor[api.Usage](),
	"Network":              reflect.TypeFor[api.Network](),
	"NetworkUsage":         reflect.TypeFor[api.NetworkUsage](),
	"PTYSize":              reflect.TypeFor[api.PTYSize](),
	"CommandRequest":       reflect.TypeFor[api.CommandRequest](),
	"CommandStarted":       reflect.TypeFor[api.CommandStarted](),
	"CommandResult":        reflect.TypeFor[api.CommandResult](),
	"SignalRequest":        reflect.TypeFor[api.SignalRequest](),
	"ExitStatus":           reflect.TypeFor[api.ExitStatus](),
	"ToolContent":          reflect.TypeFor[api.ToolContent](),
	"ToolResult":           reflect.TypeFor[api.ToolResult](),
	"ProcessInfo":          reflect.TypeFor[api.ProcessInfo](),
	"Event":                reflect.TypeFor[api.Event](),
	"FileInfo":             reflect.TypeFor[api.FileInfo](),
	"FileEvent":            reflect.TypeFor[api.FileEvent](),
	"PathRequest":          reflect.TypeFor[api.PathRequest](),
	"MoveRequest":          reflect.TypeFor[api.MoveRequest](),
	"APIKey":               reflect.TypeFor[api.APIKey](),
	"CreateKeyRequest":     reflect.TypeFor[api.CreateKeyRequest](),
	"Result":               reflect.TypeFor[api.Result](),
	"ExecutionError":       reflect.TypeFor[api.ExecutionError](),
	"Context":              reflect.TypeFor[api.Context](),
	"CreateContextRequest": reflect.TypeFor[api.CreateContextRequest](),
	"CodeRequest":          reflect.TypeFor[api.CodeRequest](),
	"CodeResult":           reflect.TypeFor[api.CodeResult](),
	"TemplateBuildRequest": reflect.TypeFor[api.TemplateBuildRequest](),
	"TemplateBuild":        reflect.TypeFor[api.TemplateBuild](),
	"TemplateBuildList":    reflect.TypeFor[api.TemplateBuildList](),
	"TemplateLogEntry":     reflect.TypeFor[api.TemplateLogEntry](),
	"Template":             reflect.TypeFor[api.Template](),
	"TemplateList":         reflect.TypeFor[api.TemplateList](),
	"TemplatePushRequest":  reflect.TypeFor[api.TemplatePushRequest](),
	"TemplatePushResult":   reflect.TypeFor[api.TemplatePushResult](),
	"TemplateTagRequest":   reflect.TypeFor[api.TemplateTagRequest](),
	"TemplateUpdate":       reflect.TypeFor[api.TemplateUpdate](),
}

// enumSchemas maps each string enumeration of the spec to the Go source
// that declares its constants: the directory (relative to api/) and the
// constants' type name.
var enumSchemas = map[string]struct{ dir, goType string }{
	"ErrorCode":    {".", "ErrorCode"},
	"EventType":    {".", "EventType"},
	"ExitReason":   {".", "ExitReason"},
	"FileType":     {".", "FileType"},
	"FileOp":       {".", "FileOp"},
	"SandboxState": {"../internal/sandbox", "State"},
}

func loadSpec(t *testing.T) *node {
	t.Helper()
	b, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseYAML(string(b))
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if v := doc.get("openapi").scalar(); !strings.HasPrefix(v, "3.1") {
		t.Fatalf("openapi: %q, want 3.1.x", v)
	}
	return doc
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

func TestRoutesMatchSpec(t *testing.T) {
	doc := loadSpec(t)
	var spec []string
	paths := doc.get("paths")
	if paths == nil {
		t.Fatal("no paths")
	}
	for _, p := range paths.keys {
		for _, m := range paths.get(p).keys {
			if slices.Contains(httpMethods, m) {
				spec = append(spec, strings.ToUpper(m)+" "+p)
			}
		}
	}
	var code []string
	for _, r := range server.Routes() {
		method, pattern, ok := strings.Cut(r, " ")
		if !ok {
			t.Fatalf("route %q has no method", r)
		}
		// The spec's path templates are ServeMux's patterns without
		// wildcards' "..." and the trailing-slash {$} anchor.
		pattern = strings.ReplaceAll(strings.ReplaceAll(pattern, "...}", "}"), "{$}", "")
		code = append(code, method+" "+pattern)
	}
	for _, r := range code {
		if !slices.Contains(spec, r) {
			t.Errorf("route %s is served but not in openapi.yaml", r)
		}
	}
	for _, r := range spec {
		if !slices.Contains(code, r) {
			t.Errorf("operation %s is in openapi.yaml but not served (internal/server.Routes)", r)
		}
	}
}

// TestPathParameters checks that every operation declares exactly the
// {wildcards} of its path as path parameters, and has responses.
func TestPathParameters(t *testing.T) {
	doc := loadSpec(t)
	paths := doc.get("paths")
	for _, p := range paths.keys {
		item := paths.get(p)
		var want []string
		for rest := p; ; {
			i := strings.IndexByte(rest, '{')
			if i < 0 {
				break
			}
			j := strings.IndexByte(rest[i:], '}')
			want = append(want, rest[i+1:i+j])
			rest = rest[i+j:]
		}
		for _, m := range item.keys {
			if !slices.Contains(httpMethods, m) {
				continue
			}
			op := item.get(m)
			var got []string
			for _, params := range []*node{item.get("parameters"), op.get("parameters")} {
				for _, prm := range params.items() {
					prm = resolve(t, doc, prm)
					if prm.get("in").scalar() == "path" {
						got = append(got, prm.get("name").scalar())
						if prm.get("required").scalar() != "true" {
							t.Errorf("%s %s: path parameter %s not required", m, p, prm.get("name").scalar())
						}
					}
				}
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s %s: path parameters %v, want %v", m, p, got, want)
			}
			if len(op.get("responses").keys) == 0 {
				t.Errorf("%s %s: no responses", m, p)
			}
		}
	}
}

// TestRefsResolve checks every $ref of the spec names something in it.
func TestRefsResolve(t *testing.T) {
	doc := loadSpec(t)
	var walk func(n *node, at string)
	walk = func(n *node, at string) {
		if n == nil {
			return
		}
		for _, k := range n.keys {
			c := n.get(k)
			if k == "$ref" {
				if _, err := lookupRef(doc, c.scalar()); err != nil {
					t.Errorf("%s: %v", at, err)
				}
			}
			walk(c, at+"/"+k)
		}
		for i, c := range n.list {
			walk(c, fmt.Sprintf("%s[%d]", at, i))
		}
	}
	walk(doc, "")
}

func TestSchemasMatchTypes(t *testing.T) {
	doc := loadSpec(t)
	schemas := doc.get("components").get("schemas")
	if schemas == nil {
		t.Fatal("no components/schemas")
	}
	for _, name := range schemas.keys {
		_, isStruct := structSchemas[name]
		_, isEnum := enumSchemas[name]
		if !isStruct && !isEnum {
			t.Errorf("schema %s is not mapped to a Go type in openapi_test.go", name)
		}
	}
	for name, typ := range structSchemas {
		s := schemas.get(name)
		if s == nil {
			t.Errorf("type %v has no schema %s", typ, name)
			continue
		}
		checkObject(t, doc, name, s, typ)
	}
}

// checkObject compares an object schema with a struct: the same property
// names as json tags, required exactly the fields that are never omitted,
// and compatible types.
func checkObject(t *testing.T, doc *node, name string, s *node, typ reflect.Type) {
	t.Helper()
	if got := s.get("type").scalar(); got != "object" {
		t.Errorf("schema %s: type %q, want object", name, got)
	}
	props := s.get("properties")
	var fields, required []string
	for f := range typ.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		jname, opts, _ := strings.Cut(tag, ",")
		if jname == "" {
			jname = f.Name
		}
		fields = append(fields, jname)
		optional := slices.ContainsFunc(strings.Split(opts, ","), func(o string) bool { return o == "omitempty" || o == "omitzero" })
		if !optional {
			required = append(required, jname)
		}
		p := props.get(jname)
		if p == nil {
			t.Errorf("schema %s: no property %q for %s.%s", name, jname, typ.Name(), f.Name)
			continue
		}
		if err := checkType(doc, p, f.Type); err != nil {
			t.Errorf("schema %s: property %q (%s.%s %v): %v", name, jname, typ.Name(), f.Name, f.Type, err)
		}
	}
	if props != nil {
		for _, k := range props.keys {
			if !slices.Contains(fields, k) {
				t.Errorf("schema %s: property %q has no json field in %v", name, k, typ)
			}
		}
	}
	var specRequired []string
	for _, r := range s.get("required").items() {
		specRequired = append(specRequired, r.scalar())
	}
	slices.Sort(required)
	slices.Sort(specRequired)
	if !slices.Equal(required, specRequired) {
		t.Errorf("schema %s: required %v, want the fields without omitempty/omitzero %v", name, specRequired, required)
	}
}

var timeType = reflect.TypeFor[time.Time]()

// checkType reports whether the property schema p fits Go type typ.
func checkType(doc *node, p *node, typ reflect.Type) error {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if ref := p.get("$ref").scalar(); ref != "" {
		target := strings.TrimPrefix(ref, "#/components/schemas/")
		if target == ref {
			return fmt.Errorf("$ref %s is not a schema", ref)
		}
		if st, ok := structSchemas[target]; ok {
			if st != typ {
				return fmt.Errorf("$ref %s is %v", target, st)
			}
			return nil
		}
		if _, ok := enumSchemas[target]; ok {
			if typ.Kind() != reflect.String {
				return fmt.Errorf("$ref to the enumeration %s, but a %v is not a string", target, typ)
			}
			return nil
		}
		return fmt.Errorf("$ref %s is not mapped to a Go type", target)
	}
	want := ""
	switch {
	case typ == timeType:
		want = "string"
		if f := p.get("format").scalar(); f != "date-time" {
			return fmt.Errorf("format %q, want date-time", f)
		}
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8:
		want = "string"
		if f := p.get("format").scalar(); f != "byte" {
			return fmt.Errorf("format %q, want byte (base64)", f)
		}
	case typ.Kind() == reflect.String:
		want = "string"
	case typ.Kind() == reflect.Bool:
		want = "boolean"
	case typ.Kind() == reflect.Float32 || typ.Kind() == reflect.Float64:
		want = "number"
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		want = "integer"
	case typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array:
		want = "array"
		items := p.get("items")
		if items == nil {
			return fmt.Errorf("array without items")
		}
		if err := checkType(doc, items, typ.Elem()); err != nil {
			return fmt.Errorf("items: %w", err)
		}
	case typ.Kind() == reflect.Map:
		want = "object"
		ap := p.get("additionalProperties")
		if ap == nil || len(ap.keys) == 0 {
			return fmt.Errorf("map without an additionalProperties schema")
		}
		if err := checkType(doc, ap, typ.Elem()); err != nil {
			return fmt.Errorf("additionalProperties: %w", err)
		}
	default:
		return fmt.Errorf("no rule for Go type %v", typ)
	}
	if got := p.get("type").scalar(); got != want {
		return fmt.Errorf("type %q, want %s", got, want)
	}
	return nil
}

// TestEnumsMatchConstants compares each enumeration schema with the string
// constants of its Go type (the empty value, never sent, is left out).
func TestEnumsMatchConstants(t *testing.T) {
	doc := loadSpec(t)
	schemas := doc.get("components").get("schemas")
	for name, src := range enumSchemas {
		s := schemas.get(name)
		if s == nil {
			t.Errorf("no schema %s for the constants of %s", name, src.goType)
			continue
		}
		var spec []string
		for _, v := range s.get("enum").items() {
			spec = append(spec, v.scalar())
		}
		code, err := constants(src.dir, src.goType)
		if err != nil {
			t.Fatal(err)
		}
		code = slices.DeleteFunc(code, func(v string) bool { return v == "" })
		if len(code) == 0 {
			t.Errorf("no constants of type %s in %s", src.goType, src.dir)
		}
		slices.Sort(spec)
		slices.Sort(code)
		if !slices.Equal(spec, code) {
			t.Errorf("schema %s: enum %v, want the constants of %s %v", name, spec, src.goType, code)
		}
	}
}

// TestSchemasCoverAPITypes checks that every exported struct type of
// package api has a schema in structSchemas, so a new wire type cannot be
// left out of the spec.
func TestSchemasCoverAPITypes(t *testing.T) {
	pkgs, err := parseDir(".")
	if err != nil {
		t.Fatal(err)
	}
	mapped := map[string]bool{}
	for _, typ := range structSchemas {
		mapped[typ.Name()] = true
	}
	for _, f := range pkgs {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, isStruct := ts.Type.(*ast.StructType); isStruct && ts.Name.IsExported() && !mapped[ts.Name.Name] {
					t.Errorf("api.%s has no schema in openapi.yaml (add it there and to structSchemas)", ts.Name.Name)
				}
			}
		}
	}
}

// parseDir parses the non-test Go files of dir.
func parseDir(dir string) ([]*ast.File, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// constants returns the values of the string constants declared with type
// typeName in the Go files of dir.
func constants(dir, typeName string) ([]string, error) {
	files, err := parseDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typeName {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						return nil, fmt.Errorf("%s: constant of type %s is not a string literal", dir, typeName)
					}
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						return nil, err
					}
					out = append(out, s)
				}
			}
		}
	}
	return out, nil
}

// resolve follows n's $ref, if any.
func resolve(t *testing.T, doc, n *node) *node {
	t.Helper()
	ref := n.get("$ref").scalar()
	if ref == "" {
		return n
	}
	target, err := lookupRef(doc, ref)
	if err != nil {
		t.Fatal(err)
	}
	return target
}

// lookupRef finds a local reference such as #/components/schemas/Event.
func lookupRef(doc *node, ref string) (*node, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	n := doc
	for _, k := range strings.Split(rest, "/") {
		k = strings.ReplaceAll(strings.ReplaceAll(k, "~1", "/"), "~0", "~")
		if n = n.get(k); n == nil {
			return nil, fmt.Errorf("$ref %q names nothing", ref)
		}
	}
	return n, nil
}

// node is a YAML value: a scalar, a mapping (keys in order) or a sequence.
type node struct {
	value string
	keys  []string
	m     map[string]*node
	list  []*node
}

// get returns the value of key in a mapping, nil if absent (or n is nil).
func (n *node) get(key string) *node {
	if n == nil || n.m == nil {
		return nil
	}
	return n.m[key]
}

func (n *node) scalar() string {
	if n == nil {
		return ""
	}
	return n.value
}

func (n *node) items() []*node {
	if n == nil {
		return nil
	}
	return n.list
}

// yamlLine is one significant line: its indentation and text.
type yamlLine struct {
	indent int
	text   string
	num    int
}

// parseYAML reads the subset of YAML that openapi.yaml uses: block
// mappings and sequences indented with spaces, plain and quoted scalars,
// flow sequences of scalars ([a, b]), {} and [], and | or > block scalars
// (kept as their raw lines). Comments must be on lines of their own.
func parseYAML(src string) (*node, error) {
	var lines []yamlLine
	for i, l := range strings.Split(src, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		if strings.TrimSpace(trimmed) == "" || strings.HasPrefix(trimmed, "#") {
			lines = append(lines, yamlLine{indent: -1, num: i + 1}) // blank: only block scalars keep it
			continue
		}
		if strings.HasPrefix(trimmed, "\t") {
			return nil, fmt.Errorf("line %d: tab indentation", i+1)
		}
		lines = append(lines, yamlLine{indent: len(l) - len(trimmed), text: strings.TrimRight(trimmed, " \r"), num: i + 1})
	}
	p := &yamlParser{lines: lines}
	p.skipBlank()
	if p.i >= len(p.lines) {
		return &node{}, nil
	}
	n, err := p.block(p.lines[p.i].indent)
	if err != nil {
		return nil, err
	}
	if p.skipBlank(); p.i < len(p.lines) {
		return nil, fmt.Errorf("line %d: unexpected indentation", p.lines[p.i].num)
	}
	return n, nil
}

type yamlParser struct {
	lines []yamlLine
	i     int
}

func (p *yamlParser) skipBlank() {
	for p.i < len(p.lines) && p.lines[p.i].indent < 0 {
		p.i++
	}
}

// block parses the mapping or sequence whose lines start at indent.
func (p *yamlParser) block(indent int) (*node, error) {
	p.skipBlank()
	l := p.lines[p.i]
	if l.text == "-" || strings.HasPrefix(l.text, "- ") {
		return p.sequence(indent)
	}
	return p.mapping(indent)
}

func (p *yamlParser) sequence(indent int) (*node, error) {
	n := &node{}
	for p.skipBlank(); p.i < len(p.lines); p.skipBlank() {
		l := p.lines[p.i]
		if l.indent < indent {
			break
		}
		if l.indent > indent || !(l.text == "-" || strings.HasPrefix(l.text, "- ")) {
			return nil, fmt.Errorf("line %d: want a sequence item", l.num)
		}
		item := strings.TrimSpace(strings.TrimPrefix(l.text, "-"))
		if item == "" {
			p.i++
			c, err := p.child(indent)
			if err != nil {
				return nil, err
			}
			n.list = append(n.list, c)
			continue
		}
		if _, _, isMap := splitKey(item); isMap {
			// "- key: value": a mapping whose keys are indented past "- ".
			p.lines[p.i] = yamlLine{indent: indent + 2, text: item, num: l.num}
			c, err := p.mapping(indent + 2)
			if err != nil {
				return nil, err
			}
			n.list = append(n.list, c)
			continue
		}
		p.i++
		c, err := flowScalar(item, l.num)
		if err != nil {
			return nil, err
		}
		n.list = append(n.list, c)
	}
	return n, nil
}

func (p *yamlParser) mapping(indent int) (*node, error) {
	n := &node{m: map[string]*node{}}
	for p.skipBlank(); p.i < len(p.lines); p.skipBlank() {
		l := p.lines[p.i]
		if l.indent < indent {
			break
		}
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.num)
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			return nil, fmt.Errorf("line %d: want key: value", l.num)
		}
		if _, dup := n.m[key]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %q", l.num, key)
		}
		p.i++
		var v *node
		var err error
		switch {
		case rest == "":
			v, err = p.child(indent)
		case rest[0] == '|' || rest[0] == '>':
			v = p.blockScalar(indent)
		default:
			v, err = flowScalar(rest, l.num)
		}
		if err != nil {
			return nil, err
		}
		n.keys = append(n.keys, key)
		n.m[key] = v
	}
	return n, nil
}

// child parses the block nested under a line at indent, or an empty
// scalar if there is none.
func (p *yamlParser) child(indent int) (*node, error) {
	p.skipBlank()
	if p.i >= len(p.lines) || p.lines[p.i].indent <= indent {
		return &node{}, nil
	}
	return p.block(p.lines[p.i].indent)
}

// blockScalar consumes the lines of a | or > scalar.
func (p *yamlParser) blockScalar(indent int) *node {
	var text []string
	for ; p.i < len(p.lines); p.i++ {
		l := p.lines[p.i]
		if l.indent >= 0 && l.indent <= indent {
			break
		}
		text = append(text, l.text)
	}
	return &node{value: strings.TrimSpace(strings.Join(text, "\n"))}
}

// splitKey splits "key: rest" or "key:"; the key may be quoted.
func splitKey(s string) (key, rest string, ok bool) {
	if s != "" && (s[0] == '\'' || s[0] == '"') {
		end := strings.IndexByte(s[1:], s[0])
		if end < 0 {
			return "", "", false
		}
		key, after := s[1:end+1], s[end+2:]
		if after == ":" {
			return key, "", true
		}
		if r, ok := strings.CutPrefix(after, ": "); ok {
			return key, strings.TrimSpace(r), true
		}
		return "", "", false
	}
	if k, ok := strings.CutSuffix(s, ":"); ok && !strings.Contains(k, ": ") {
		return k, "", true
	}
	k, r, ok := strings.Cut(s, ": ")
	if !ok || strings.ContainsAny(k[:min(1, len(k))], "[{") {
		return "", "", false
	}
	return k, strings.TrimSpace(r), true
}

// flowScalar parses an inline value: a scalar, [] / {} or [a, b].
func flowScalar(s string, num int) (*node, error) {
	switch {
	case s == "{}":
		return &node{m: map[string]*node{}}, nil
	case strings.HasPrefix(s, "["):
		if !strings.HasSuffix(s, "]") {
			return nil, fmt.Errorf("line %d: unterminated flow sequence", num)
		}
		n := &node{list: []*node{}}
		if inner := strings.TrimSpace(s[1 : len(s)-1]); inner != "" {
			for _, it := range strings.Split(inner, ",") {
				n.list = append(n.list, &node{value: unquote(strings.TrimSpace(it))})
			}
		}
		return n, nil
	case strings.HasPrefix(s, "{"):
		return nil, fmt.Errorf("line %d: flow mappings are not supported", num)
	}
	return &node{value: unquote(s)}, nil
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' {
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'")
	}
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
	}
	return s
}

// TestYAMLReader pins down the reader on the constructs the spec uses.
func TestYAMLReader(t *testing.T) {
	doc, err := parseYAML(`# comment
a: 1
'/x/{id}':
  get:
    parameters:
      - $ref: '#/p'
      - name: n
        in: query
    d: |
      text: with colons
      - and dashes

    e: 'it''s'
list:
  - x
  - "y"
flow: [a, 'b']
empty: []
obj: {}
`)
	if err != nil {
		t.Fatal(err)
	}
	get := doc.get("/x/{id}").get("get")
	prm := get.get("parameters").items()
	switch {
	case doc.get("a").scalar() != "1":
		t.Error("a")
	case len(prm) != 2 || prm[0].get("$ref").scalar() != "#/p" || prm[1].get("in").scalar() != "query":
		t.Errorf("parameters: %+v", prm)
	case get.get("d").scalar() != "text: with colons\n- and dashes":
		t.Errorf("block scalar %q", get.get("d").scalar())
	case get.get("e").scalar() != "it's":
		t.Error("quoted")
	case len(doc.get("list").items()) != 2 || doc.get("list").items()[1].scalar() != "y":
		t.Error("list")
	case len(doc.get("flow").items()) != 2 || doc.get("flow").items()[1].scalar() != "b":
		t.Error("flow")
	case doc.get("empty") == nil || doc.get("obj") == nil:
		t.Error("empty")
	case !slices.Equal(doc.keys, []string{"a", "/x/{id}", "list", "flow", "empty", "obj"}):
		t.Errorf("keys %v", doc.keys)
	}
	for _, bad := range []string{"a: 1\n  b: 2\n", "a: 1\na: 2\n", "- a\nb: 1\n"} {
		if _, err := parseYAML(bad); err == nil {
			t.Errorf("parseYAML(%q) succeeded", bad)
		}
	}
}

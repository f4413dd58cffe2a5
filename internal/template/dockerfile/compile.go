// Package dockerfile is Kiln's Dockerfile front end. Compile turns a
// Dockerfile, parsed with BuildKit's own parser, into a template recipe
// (api.TemplateSpec: a base and E2B-shaped steps), the way E2B's SDK
// compiles one on the client; Context holds the build context those steps
// copy from: it applies .dockerignore, matches COPY/ADD sources, computes
// each step's FilesHash exactly as E2B's SDK does and writes the tar that
// is uploaded under it.
//
// What is supported, ignored and refused is listed in docs/templates.md
// ("Dockerfiles"). Every error is errdefs.ErrInvalidArgument and names the
// Dockerfile line.
package dockerfile

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Options are the inputs of a compile besides the Dockerfile.
type Options struct {
	// BuildArgs override ARG defaults (docker build --build-arg). One that
	// no ARG declares gives a warning.
	BuildArgs map[string]string
	// IsTemplate says whether a bare FROM name (no registry, no '/', no
	// digest; the tag removed) is a Kiln template. Nil: none is.
	IsTemplate func(name string) bool
}

// Compile compiles a Dockerfile into a template recipe. Each step carries
// the line it came from. The warnings name what was ignored, each with its
// line ("Dockerfile:3: EXPOSE is ignored ...").
//
// The recipe's StepEnv values are double-quoted shell words: the engine
// evaluates each one in the build sandbox (printf '%s' "<value>"), so a
// reference to a variable of the base image (ENV PATH=/opt/bin:$PATH)
// takes the base's value, as in Docker. Every other argument is literal.
func Compile(dockerfile []byte, opts Options) (*api.TemplateSpec, []string, error) {
	if bytes.Contains(dockerfile, []byte(unknownMark)) {
		return nil, nil, fmt.Errorf("Dockerfile contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	for k, v := range opts.BuildArgs {
		if strings.Contains(k+v, unknownMark) || k == "" {
			return nil, nil, fmt.Errorf("build arg %q: %w", errdefs.Clip(k), errdefs.ErrInvalidArgument)
		}
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, nil, parseError(err)
	}
	c := &compiler{
		opts:   opts,
		lex:    shell.NewLex(res.EscapeToken),
		global: newScope(),
		used:   map[string]bool{},
	}
	if name, _, _, ok := parser.DetectSyntax(dockerfile); ok {
		c.warn(1, fmt.Sprintf("the syntax directive (%s) is ignored: Kiln compiles Dockerfiles itself", errdefs.Clip(name)))
	}
	for _, w := range res.Warnings {
		line := 0
		if w.Location != nil {
			line = w.Location.Start.Line
		}
		c.warn(line, errdefs.Clip(w.Short))
	}
	for _, n := range res.AST.Children {
		if err := c.instruction(n); err != nil {
			return nil, nil, err
		}
	}
	if c.stage == nil {
		return nil, nil, lineError(res.AST.EndLine, "no FROM instruction")
	}
	c.spec.StartCmd = c.startCmd()
	var unused []string
	for k := range opts.BuildArgs {
		if !c.used[k] {
			unused = append(unused, k)
		}
	}
	slices.Sort(unused)
	for _, k := range unused {
		c.warnings = append(c.warnings, fmt.Sprintf("build arg %s is not declared by any ARG and was not used", errdefs.Clip(k)))
	}
	return &c.spec, c.warnings, nil
}

// compiler is the state of one Compile.
type compiler struct {
	opts     Options
	lex      *shell.Lex
	spec     api.TemplateSpec
	warnings []string
	global   *scope // ARGs before FROM
	stage    *scope // nil until FROM
	used     map[string]bool
	workdir  string // the last WORKDIR ("" none yet)
	userSet  bool   // a USER instruction came before
	cmd      *command
	entry    *command
}

// command is a CMD or ENTRYPOINT: exec form (JSON) or a shell line.
type command struct {
	exec []string
	line string
	json bool
}

func (c *compiler) warn(line int, msg string) {
	c.warnings = append(c.warnings, fmt.Sprintf("Dockerfile:%d: %s", line, msg))
}

// lineError is an invalid-argument error naming a Dockerfile line.
func lineError(line int, msg string) error {
	return fmt.Errorf("Dockerfile:%d: %s: %w", line, msg, errdefs.ErrInvalidArgument)
}

// parseError turns a parser error into one naming its line.
func parseError(err error) error {
	line := 0
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		line = le.Locations[0][0].Start.Line
	}
	return lineError(line, "parsing: "+errdefs.Clip(err.Error()))
}

// ignored are instructions that have no meaning for a Kiln template, each
// with the reason given in its warning.
var ignored = map[string]string{
	"expose":      "sandbox ports are reachable without it",
	"volume":      "sandboxes have no volumes",
	"label":       "templates have no labels",
	"healthcheck": "use the template's ready command",
	"stopsignal":  "sandboxes are stopped by Kiln",
	"maintainer":  "deprecated metadata",
}

func (c *compiler) instruction(n *parser.Node) error {
	name := strings.ToLower(n.Value)
	line := n.StartLine
	if name != "from" && name != "arg" && c.stage == nil {
		return lineError(line, strings.ToUpper(name)+" before FROM (only ARG may come before FROM)")
	}
	switch name {
	case "from":
		return c.from(n)
	case "arg":
		return c.arg(n)
	case "run":
		return c.run(n)
	case "copy", "add":
		return c.copy(n, name)
	case "env":
		return c.env(n)
	case "workdir":
		return c.setWorkdir(n)
	case "user":
		return c.setUser(n)
	case "cmd", "entrypoint":
		return c.command(n, name)
	case "shell":
		return lineError(line, "SHELL is not supported: RUN always uses /bin/sh -c")
	case "onbuild":
		return lineError(line, "ONBUILD is not supported")
	}
	if why, ok := ignored[name]; ok {
		c.warn(line, fmt.Sprintf("%s is ignored (%s)", strings.ToUpper(name), why))
		return nil
	}
	return lineError(line, fmt.Sprintf("unknown instruction %s", errdefs.Clip(n.Value)))
}

// words are an instruction's arguments as the parser split them.
func words(n *parser.Node) []string {
	var w []string
	for a := n.Next; a != nil; a = a.Next {
		w = append(w, a.Value)
	}
	return w
}

func noFlags(n *parser.Node) error {
	if len(n.Flags) > 0 {
		return lineError(n.StartLine, fmt.Sprintf("%s does not support the flag %s", strings.ToUpper(n.Value), errdefs.Clip(n.Flags[0])))
	}
	return nil
}

// expand expands word as Docker does. keep keeps references to unknown
// variables (ENV and ARG values); otherwise they expand to empty with a
// warning.
func (c *compiler) expand(line int, s *scope, word string, keep bool) (string, error) {
	l := &lookup{s: s, keep: keep}
	v, _, err := c.lex.ProcessWord(word, l)
	if err != nil {
		return "", lineError(line, errdefs.Clip(err.Error()))
	}
	if keep {
		return v, nil
	}
	v, names := literal(v)
	for k := range l.missing {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range slices.Compact(names) {
		c.warn(line, fmt.Sprintf("variable %s is not set by the Dockerfile and expands to empty here (Docker would take it from the base image's environment)", errdefs.Clip(k)))
	}
	return v, nil
}

func (c *compiler) from(n *parser.Node) error {
	line := n.StartLine
	if c.stage != nil {
		return lineError(line, "multi-stage builds are not supported (a second FROM): build the stages as separate templates and FROM the template")
	}
	if len(n.Flags) > 0 {
		return lineError(line, fmt.Sprintf("FROM does not support the flag %s (Kiln builds for the host's platform)", errdefs.Clip(n.Flags[0])))
	}
	w := words(n)
	if len(w) != 1 && !(len(w) == 3 && strings.EqualFold(w[1], "as")) {
		return lineError(line, "FROM takes an image or template and an optional AS name")
	}
	ref, err := c.expand(line, c.global, w[0], false)
	if err != nil {
		return err
	}
	switch {
	case ref == "" || strings.ContainsAny(ref, " \t\n"):
		return lineError(line, fmt.Sprintf("FROM %q is not an image reference", errdefs.Clip(ref)))
	case ref == "scratch":
		return lineError(line, "FROM scratch is not supported: a template needs a base with a shell")
	}
	name, _, _ := strings.Cut(ref, ":")
	if !strings.ContainsAny(ref, "/@") && c.opts.IsTemplate != nil && c.opts.IsTemplate(name) {
		c.spec.From.Template = ref
	} else {
		c.spec.From.Image = ref
	}
	c.stage = newScope()
	return nil
}

func (c *compiler) arg(n *parser.Node) error {
	line := n.StartLine
	if err := noFlags(n); err != nil {
		return err
	}
	w := words(n)
	if len(w) == 0 {
		return lineError(line, "ARG needs a name")
	}
	s := c.stage
	if s == nil {
		s = c.global
	}
	for _, word := range w {
		k, v, hasValue := strings.Cut(word, "=")
		key, err := c.expand(line, s, k, false)
		if err != nil {
			return err
		}
		if key == "" {
			return lineError(line, "ARG needs a name")
		}
		var value *string
		switch {
		case hasValue:
			x, err := c.expand(line, s, v, true)
			if err != nil {
				return err
			}
			value = &x
		case c.stage != nil:
			// A bare ARG in the stage takes the global ARG's value.
			value = c.global.args[key]
		}
		if b, ok := c.opts.BuildArgs[key]; ok {
			value = &b
		}
		c.used[key] = true
		if value == nil && c.stage != nil && platformArg(key) {
			c.warn(line, fmt.Sprintf("ARG %s has no value: Kiln does not predefine the platform ARGs (pass --build-arg %s=...)", key, key))
		}
		s.args[key] = value
	}
	return nil
}

// platformArg reports whether name is one of the ARGs BuildKit predefines.
func platformArg(name string) bool {
	return strings.HasPrefix(name, "TARGET") || strings.HasPrefix(name, "BUILD")
}

func (c *compiler) env(n *parser.Node) error {
	line := n.StartLine
	if err := noFlags(n); err != nil {
		return err
	}
	w := words(n)
	if len(w) == 0 || len(w)%3 != 0 {
		return lineError(line, "ENV needs name=value pairs")
	}
	step := api.TemplateStep{Type: api.StepEnv, Line: line}
	for i := 0; i < len(w); i += 3 {
		key, err := c.expand(line, c.stage, w[i], false)
		if err != nil {
			return err
		}
		if key == "" || strings.Contains(key, "=") {
			return lineError(line, fmt.Sprintf("ENV name %q is not valid", errdefs.Clip(key)))
		}
		value, err := c.expand(line, c.stage, w[i+1], true)
		if err != nil {
			return err
		}
		c.stage.env[key] = value
		step.Args = append(step.Args, key, shellWord(value))
	}
	c.spec.Steps = append(c.spec.Steps, step)
	return nil
}

func (c *compiler) setWorkdir(n *parser.Node) error {
	dir, err := c.oneWord(n, "path")
	if err != nil {
		return err
	}
	c.workdir = c.resolve(dir)
	c.spec.Steps = append(c.spec.Steps, api.TemplateStep{Type: api.StepWorkdir, Args: []string{c.workdir}, Line: n.StartLine})
	return nil
}

// oneWord is the expanded argument of an instruction that takes one
// (what names it in errors).
func (c *compiler) oneWord(n *parser.Node, what string) (string, error) {
	if err := noFlags(n); err != nil {
		return "", err
	}
	instr := strings.ToUpper(n.Value)
	w := words(n)
	if len(w) != 1 {
		return "", lineError(n.StartLine, fmt.Sprintf("%s takes one %s", instr, what))
	}
	v, err := c.expand(n.StartLine, c.stage, w[0], false)
	if err == nil && v == "" {
		err = lineError(n.StartLine, fmt.Sprintf("%s needs a %s", instr, what))
	}
	return v, err
}

// resolve makes p absolute against the last WORKDIR, as Docker does. With
// no WORKDIR before, a relative p stays relative: the engine resolves it
// against the base's working directory.
func (c *compiler) resolve(p string) string {
	if !path.IsAbs(p) && c.workdir != "" {
		p = path.Join(c.workdir, p)
	}
	return path.Clean(p)
}

func (c *compiler) setUser(n *parser.Node) error {
	user, err := c.oneWord(n, "user")
	if err != nil {
		return err
	}
	if strings.ContainsAny(user, " \t") {
		return lineError(n.StartLine, fmt.Sprintf("USER %q is not a user", errdefs.Clip(user)))
	}
	c.userSet = true
	c.spec.Steps = append(c.spec.Steps, api.TemplateStep{Type: api.StepUser, Args: []string{user}, Line: n.StartLine})
	return nil
}

func (c *compiler) command(n *parser.Node, name string) error {
	if err := noFlags(n); err != nil {
		return err
	}
	if len(n.Heredocs) > 0 {
		return lineError(n.StartLine, strings.ToUpper(name)+" with a heredoc is not supported")
	}
	cmd := &command{exec: words(n), json: n.Attributes["json"]}
	if !cmd.json {
		cmd.line = strings.Join(cmd.exec, " ")
		cmd.exec = nil
	}
	if name == "cmd" {
		c.cmd = cmd
	} else {
		c.entry = cmd
	}
	return nil
}

// startCmd combines the last ENTRYPOINT and CMD as Docker does, as one
// command line for /bin/sh -c: a shell-form ENTRYPOINT ignores CMD, an
// exec-form one takes CMD's words (a shell-form CMD as /bin/sh -c LINE)
// as its arguments.
func (c *compiler) startCmd() string {
	argv := func(cmd *command) []string {
		if cmd == nil {
			return nil
		}
		if cmd.json {
			return cmd.exec
		}
		return []string{"/bin/sh", "-c", cmd.line}
	}
	switch {
	case c.entry != nil && !c.entry.json:
		return c.entry.line
	case c.entry != nil:
		return quoteArgs(append(slices.Clone(c.entry.exec), argv(c.cmd)...))
	case c.cmd != nil && !c.cmd.json:
		return c.cmd.line
	case c.cmd != nil && len(c.cmd.exec) > 0:
		return quoteArgs(c.cmd.exec)
	}
	return ""
}

func (c *compiler) run(n *parser.Node) error {
	line := n.StartLine
	if len(n.Flags) > 0 {
		name, _, _ := strings.Cut(strings.TrimPrefix(n.Flags[0], "--"), "=")
		return lineError(line, fmt.Sprintf("RUN --%s is not supported", errdefs.Clip(name)))
	}
	w := words(n)
	var cmd string
	switch {
	case n.Attributes["json"]:
		if len(w) == 0 {
			return lineError(line, "RUN needs a command")
		}
		cmd = quoteArgs(w)
	case len(n.Heredocs) > 0:
		var err error
		if cmd, err = heredocScript(line, strings.Join(w, " "), n.Heredocs); err != nil {
			return err
		}
	default:
		cmd = strings.Join(w, " ")
	}
	if strings.TrimSpace(cmd) == "" {
		return lineError(line, "RUN needs a command")
	}
	c.spec.Steps = append(c.spec.Steps, api.TemplateStep{Type: api.StepRun, Args: []string{c.argPrefix(line) + cmd}, Line: line})
	return nil
}

// heredocScript is the shell script of a RUN with heredocs, as BuildKit
// runs it: a lone heredoc is the script itself; otherwise the line and its
// heredocs are handed to the shell, which reads the heredocs itself.
func heredocScript(line int, cmdline string, docs []parser.Heredoc) (string, error) {
	if h := parser.MustParseHeredoc(cmdline); h != nil && len(docs) == 1 {
		data := docs[0].Content
		if docs[0].Chomp {
			data = parser.ChompHeredocContent(data)
		}
		if strings.HasPrefix(data, "#!") {
			return "", lineError(line, "RUN with a heredoc that starts with #! is not supported: RUN the interpreter with the heredoc as its input (RUN python3 <<EOF)")
		}
		return data, nil
	}
	var b strings.Builder
	b.WriteString(cmdline)
	for _, d := range docs {
		b.WriteByte('\n')
		b.WriteString(d.Content)
		b.WriteString(d.Name)
	}
	return b.String(), nil
}

// argPrefix exports the ARGs in scope to a RUN, as Docker passes them in
// its environment: they are part of the step, so a changed value rebuilds
// it, but they do not persist in the template. An ENV of the same name
// wins, as in Docker.
func (c *compiler) argPrefix(line int) string {
	var names []string
	for k, v := range c.stage.args {
		if _, isEnv := c.stage.env[k]; v != nil && !isEnv {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("export")
	for _, k := range names {
		if !shellName.MatchString(k) {
			c.warn(line, fmt.Sprintf("ARG %s is not a shell variable name: RUN does not see it", errdefs.Clip(k)))
			continue
		}
		fmt.Fprintf(&b, " %s=\"%s\"", k, shellWord(*c.stage.args[k]))
	}
	if b.Len() == len("export") {
		return ""
	}
	b.WriteString("; ")
	return b.String()
}

// copy compiles COPY and ADD: one step per source, all to the same
// destination.
func (c *compiler) copy(n *parser.Node, name string) error {
	line := n.StartLine
	instr := strings.ToUpper(name)
	var chown, chmod string
	for _, f := range n.Flags {
		k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		var err error
		switch k {
		case "chown":
			chown, err = c.expand(line, c.stage, v, false)
			if err == nil && chown == "" {
				return lineError(line, instr+" --chown needs an owner")
			}
		case "chmod":
			if chmod, err = c.expand(line, c.stage, v, false); err == nil {
				chmod, err = octalMode(line, instr, chmod)
			}
		case "link":
			c.warn(line, instr+" --link is ignored (every step is its own layer)")
		case "from":
			return lineError(line, instr+" --from is not supported: multi-stage builds are not supported")
		default:
			return lineError(line, fmt.Sprintf("%s --%s is not supported", instr, errdefs.Clip(k)))
		}
		if err != nil {
			return err
		}
	}
	w := words(n)
	if len(w) < 2 {
		return lineError(line, instr+" needs a source and a destination")
	}
	for _, s := range w {
		if parser.MustParseHeredoc(s) != nil && !n.Attributes["json"] {
			return lineError(line, instr+" with a heredoc is not supported")
		}
	}
	dest, err := c.expand(line, c.stage, w[len(w)-1], false)
	if err != nil {
		return err
	}
	switch dest {
	case "":
		return lineError(line, instr+" needs a destination")
	case ".":
		dest = "./" // the working directory, a directory
	}
	srcs := w[:len(w)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return lineError(line, fmt.Sprintf("%s with several sources needs a destination directory ending in /, not %q", instr, errdefs.Clip(dest)))
	}
	if !path.IsAbs(dest) && c.workdir != "" {
		dir := strings.HasSuffix(dest, "/") || strings.HasSuffix(dest, "/.")
		dest = path.Join(c.workdir, dest)
		if dir && dest != "/" {
			dest += "/"
		}
	}
	owner := chown
	if owner == "" && c.userSet {
		// Docker's COPY makes files root's unless --chown says otherwise,
		// whatever the USER: say so, whatever the engine's default.
		owner = "0:0"
	}
	stepType := api.StepCopy
	if name == "add" {
		stepType = api.StepAdd
	}
	for _, s := range srcs {
		src, err := c.expand(line, c.stage, s, false)
		if err != nil {
			return err
		}
		if src, err = contextPath(line, instr, src); err != nil {
			return err
		}
		c.spec.Steps = append(c.spec.Steps, api.TemplateStep{Type: stepType, Args: []string{src, dest, owner, chmod}, Line: line})
	}
	return nil
}

// contextPath checks a COPY/ADD source and makes it relative to the build
// context: an absolute source is relative to the context root, as in
// Docker; one that leaves the context is refused, as is a URL.
func contextPath(line int, instr, src string) (string, error) {
	if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
		return "", lineError(line, fmt.Sprintf("%s of a URL (%s) is not supported: download it with RUN", instr, errdefs.Clip(src)))
	}
	if src == "" {
		return "", lineError(line, instr+" needs a source")
	}
	p := path.Clean("/" + src)[1:]
	if p == "" {
		p = "."
	}
	if rel := path.Clean(src); rel == ".." || strings.HasPrefix(rel, "../") {
		return "", lineError(line, fmt.Sprintf("%s source %q is outside the build context", instr, errdefs.Clip(src)))
	}
	return p, nil
}

// octalMode checks a --chmod mode and writes it with four octal digits.
func octalMode(line int, instr, mode string) (string, error) {
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o7777 {
		return "", lineError(line, fmt.Sprintf("%s --chmod=%s: only octal modes are supported", instr, errdefs.Clip(mode)))
	}
	return fmt.Sprintf("%04o", m), nil
}

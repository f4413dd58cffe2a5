// Package template finds sandbox templates: a read-only root filesystem (a
// stack of layers) plus the defaults sandboxes made from it start with. It
// holds the built-in templates' recipes, which the template engine
// (internal/template/builder) builds like any custom template; their
// builds are kept under the data dir by the hash of what they contain, so
// a rebuild never touches a root filesystem that running sandboxes use.
package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Recipe is a built-in template: a build recipe for the template engine
// (internal/template/builder), which builds it on the host (kiln template
// build, as make setup runs it) like any custom template, and its warm
// step.
type Recipe struct {
	Name string
	Spec api.TemplateSpec
	// Warm, if set, makes this a warm template: after the root filesystem
	// is built, a sandbox is booted from it, the warm step run, and its
	// checkpoint stored, so sandboxes are restored from it instead of
	// booted (see warm.go). Changing it never rebuilds the root filesystem.
	Warm *Warm
	// OnDemand leaves the recipe out of a build of "all the built-ins"
	// (kiln template build without names, as make setup runs it): it is
	// built when named (kiln template build desktop).
	OnDemand bool
}

// Defaults are what a sandbox made from the template starts with unless
// its creator says otherwise.
type Defaults struct {
	User    string            `json:"user"`
	Workdir string            `json:"workdir"`
	Env     map[string]string `json:"env,omitempty"`
	// Limits, in the units of sandbox.Limits; zero means the server's default.
	CPUs        float64 `json:"cpus,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
	// Network is the network mode of its sandboxes, "none" or "nat";
	// "" takes the server's default (docs/networking.md).
	Network string `json:"network,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName reports whether s can name a template.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// userSetup makes the unprivileged user every template has: uid 1000,
// home /home/user, passwordless sudo (as E2B's images give it), and the
// mount point for the agent.
const userSetup = "useradd --create-home --uid 1000 --user-group --shell /bin/bash user" +
	" && mkdir -p /.kiln && chmod 1777 /tmp" +
	" && echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >/etc/sudoers.d/kiln-user && chmod 0440 /etc/sudoers.d/kiln-user && visudo -c -q"

// basePackages are what E2B's images carry and user code assumes (issue
// 17 item 9): every template has them. python-is-python3 makes `python`
// python3; iproute2 brings `ss`.
var basePackages = []string{
	"curl", "wget", "sudo", "python-is-python3", "python3-pip", "git", "nodejs", "npm",
	"procps", "iproute2", "ca-certificates",
}

func run(script string) api.TemplateStep {
	return api.TemplateStep{Type: api.StepRun, Args: []string{script}}
}

func env(kv ...string) api.TemplateStep { return api.TemplateStep{Type: api.StepEnv, Args: kv} }

// asUser ends a built-in's recipe: its sandboxes run as user in its home.
var asUser = []api.TemplateStep{
	{Type: api.StepWorkdir, Args: []string{"/home/user"}},
	{Type: api.StepUser, Args: []string{"user"}},
}

// Base is the recipe of the default template: minimal Debian with the
// base packages and the user.
func Base() *Recipe {
	return &Recipe{
		Name: "base",
		Spec: api.TemplateSpec{
			From: api.TemplateBase{Debian: &api.DebianBase{
				Suite: "bookworm", Variant: "minbase",
				Include:  []string{"bash", "coreutils", "python3", "ca-certificates", "git", "procps"},
				Packages: basePackages,
			}},
			Steps: append([]api.TemplateStep{run(userSetup), env("LANG", "C.UTF-8")}, asUser...),
		},
	}
}

// CodeInterpreter is the recipe of the code-interpreter template: the base
// template (its layers, shared) plus Jupyter kernels for Python (with the
// usual data-science libraries) and R, Node.js with TypeScript, and
// toolchains for Go, Rust, C, C++ and Java. Every package comes from
// Debian, so the build needs only the Debian mirror. Matplotlib draws to
// the inline backend, so figures come back as image/png results.
func CodeInterpreter() *Recipe {
	const mplConfig = "/home/user/.config/matplotlib"
	r := &Recipe{Name: "code-interpreter"}
	r.Spec.From.Debian = &api.DebianBase{Template: "base", Packages: []string{
		// Python kernel and libraries.
		"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
		"python3-matplotlib-inline", "python3-scipy", "python3-seaborn", "python3-sklearn",
		"python3-openpyxl", "python3-requests", "python3-pil",
		// Other languages.
		// node-typescript: the TypeScript kernel transpiles cells with it
		// (node 18 cannot strip types itself).
		"node-typescript", "r-base-core", "r-cran-irkernel", "openjdk-17-jdk-headless",
		"golang-go", "rustc",
		// gcc only recommends the C library headers; without recommends
		// they must be named.
		"gcc", "g++", "make", "libc6-dev",
	}}
	r.Spec.Steps = append([]api.TemplateStep{
		env("LANG", "C.UTF-8", "MPLBACKEND", "module://matplotlib_inline.backend_inline", "MPLCONFIGDIR", mplConfig),
		// Build matplotlib's font cache once, as the user, so the first
		// plot in a sandbox does not pay for it.
		{Type: api.StepRun, Args: []string{"mkdir -p " + mplConfig + " && python3 -c 'import matplotlib.pyplot'", "user"}},
	}, asUser...)
	r.Spec.MemoryMB, r.Spec.DiskMB = 1024, 4096
	// Sandboxes start with the Python kernel up and the data stack
	// imported (into sys.modules, not the user's namespace).
	r.Warm = &Warm{
		Language: "python",
		Code:     "import numpy, pandas, matplotlib.pyplot\ndel numpy, pandas, matplotlib",
	}
	return r
}

// Builtin returns the built-in recipes by name.
func Builtin() map[string]*Recipe {
	m := map[string]*Recipe{}
	for _, r := range []*Recipe{Base(), CodeInterpreter(), Desktop()} {
		m[r.Name] = r
	}
	return m
}

// Template is a built template, ready to make sandboxes from: a built-in
// one (its root filesystem is one directory, rootfs/) or a build of a
// custom template (its root filesystem is a stack of shared layers).
type Template struct {
	Name     string   `json:"name"`
	Hash     string   `json:"hash"`
	Dir      string   `json:"-"` // the build's dir: rootfs/ or layers, template.json, warm/
	Rootfs   string   `json:"-"` // the overlay lower dir: one dir, or layer dirs top first joined by ':'
	Defaults Defaults `json:"defaults"`
	Warm     *Warm    `json:"warm,omitempty"`
	// Build is the id of a custom template's build ("" for a built-in);
	// Layers are its layer dirs, bottom first.
	Build  string   `json:"build,omitempty"`
	Layers []string `json:"layers,omitempty"`
}

// manifest is written next to a finished rootfs; its presence marks the
// build complete.
const manifestName = "template.json"

// WriteManifest writes t as the manifest of the build dir dir (where
// Lookup and Catalog.Build read it), atomically and flushed to disk.
func WriteManifest(dir string, t *Template) error {
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := writeSynced(filepath.Join(dir, manifestName), b); err != nil {
		return fmt.Errorf("writing template manifest: %w", err)
	}
	return nil
}

// Dir is where templates live under a data dir.
func Dir(dataDir string) string { return filepath.Join(dataDir, "templates") }

// Lookup finds the current build of the named template.
func Lookup(dataDir, name string) (*Template, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("template name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(Dir(dataDir), name, "current"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template %q: %w (build it with `kiln template build %s`)", name, errdefs.ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("resolving template %q: %w", name, err)
	}
	return ReadBuild(dir)
}

// ReadBuild reads the manifest of the build in dir.
func ReadBuild(dir string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, fmt.Errorf("reading template manifest: %w", err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("decoding template manifest %s: %w", dir, err)
	}
	t.Dir = dir
	t.Rootfs = filepath.Join(dir, "rootfs")
	if len(t.Layers) > 0 {
		t.Rootfs = Lower(t.Layers)
	}
	return &t, nil
}

// File is the host path of the file at p (absolute, in the template's
// root filesystem) in the topmost layer that has it ("" if none does),
// to read it without mounting the stack.
func (t *Template) File(p string) string {
	if len(t.Layers) == 0 {
		return filepath.Join(t.Rootfs, p)
	}
	for i := len(t.Layers) - 1; i >= 0; i-- {
		f := filepath.Join(t.Layers[i], p)
		if _, err := os.Lstat(f); err == nil {
			return f
		}
	}
	return ""
}

// Lower is the overlay lowerdir option of a stack of layer dirs given
// bottom first: the topmost first, joined by ':'.
func Lower(layers []string) string {
	top := slices.Clone(layers)
	slices.Reverse(top)
	return strings.Join(top, ":")
}

// List returns the templates that have a current build.
func List(dataDir string) ([]*Template, error) {
	ents, err := os.ReadDir(Dir(dataDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var ts []*Template
	for _, e := range ents {
		if t, err := Lookup(dataDir, e.Name()); err == nil {
			ts = append(ts, t)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts, nil
}

package builder

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Bounds of a recipe.
const (
	MaxSteps     = 500
	maxArgBytes  = 64 << 10 // one argument (a RUN script)
	maxSpecBytes = 1 << 20  // all arguments and commands together
	maxPathBytes = 4096
)

var (
	filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	envNameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	octalRE     = regexp.MustCompile(`^[0-7]{1,4}$`)
	// debianNameRE is a Debian suite, debootstrap variant or package name.
	debianNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]{0,63}$`)
)

// validDebian checks a Debian base's names: they go on debootstrap's and
// apt-get's command lines.
func validDebian(d *api.DebianBase) error {
	names := append(slices.Clone(d.Include), d.Packages...)
	if d.Template != "" {
		if d.Suite != "" || d.Variant != "" || len(d.Include) > 0 || len(d.Packages) == 0 {
			return invalid(-1, nil, "from.debian: with a template, give packages and no suite, variant or include")
		}
		if _, _, err := template.ParseRef(d.Template); err != nil {
			return err
		}
	} else {
		names = append(names, d.Suite, d.Variant)
	}
	for _, s := range names {
		if !debianNameRE.MatchString(s) {
			return invalid(-1, nil, "from.debian: %q is not a Debian suite, variant or package name", errdefs.ClipN(s, 80))
		}
	}
	return nil
}

// invalid is an ErrInvalidArgument about step i (-1: the recipe).
func invalid(i int, st *api.TemplateStep, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if st != nil {
		msg = stepName(i, *st) + ": " + msg
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument)
}

// stepName names step i for messages: "step 3 (RUN)", or its Dockerfile
// line when it has one.
func stepName(i int, st api.TemplateStep) string {
	if st.Line > 0 {
		return fmt.Sprintf("step %d (%s, Dockerfile line %d)", i+1, st.Type, st.Line)
	}
	return fmt.Sprintf("step %d (%s)", i+1, st.Type)
}

// validate checks a recipe before anything is recorded.
func validate(spec *api.TemplateSpec) error {
	f := spec.From
	n := 0
	for _, s := range []string{f.Template, f.Image, f.Archive} {
		if s != "" {
			n++
		}
	}
	if f.Debian != nil {
		n++
	}
	if n != 1 {
		return invalid(-1, nil, "from: want exactly one of template, image or archive")
	}
	switch {
	case f.Debian != nil:
		if err := validDebian(f.Debian); err != nil {
			return err
		}
	case f.Template != "":
		if _, _, err := template.ParseRef(f.Template); err != nil {
			return err
		}
	case f.Image != "":
		if len(f.Image) > 512 || strings.ContainsAny(f.Image, " \t\n\x00") {
			return invalid(-1, nil, "from: malformed image reference %q", errdefs.ClipN(f.Image, 80))
		}
	case f.Archive != "":
		if !filesHashRE.MatchString(f.Archive) {
			return invalid(-1, nil, "from: archive must be the hex SHA-256 of an uploaded file")
		}
	}
	if f.Registry != nil && f.Image == "" {
		return invalid(-1, nil, "from: registry credentials go with an image")
	}
	if spec.CPUs < 0 || spec.MemoryMB < 0 || spec.DiskMB < 0 {
		return invalid(-1, nil, "cpus, memory_mb and disk_mb: want 0 (the server's default) or more")
	}
	if len(spec.Steps) > MaxSteps {
		return invalid(-1, nil, "%d steps: at most %d", len(spec.Steps), MaxSteps)
	}
	total := len(spec.StartCmd) + len(spec.ReadyCmd)
	for _, c := range []string{spec.StartCmd, spec.ReadyCmd} {
		if len(c) > maxArgBytes || strings.ContainsRune(c, 0) {
			return invalid(-1, nil, "start and ready commands: at most %d bytes, no NUL", maxArgBytes)
		}
	}
	if spec.ReadyCmd != "" && spec.StartCmd == "" {
		return invalid(-1, nil, "a ready command needs a start command")
	}
	for i := range spec.Steps {
		st := &spec.Steps[i]
		for _, a := range st.Args {
			total += len(a)
			if len(a) > maxArgBytes || strings.ContainsRune(a, 0) {
				return invalid(i, st, "arguments: at most %d bytes each, no NUL", maxArgBytes)
			}
		}
		if err := validateStep(i, st); err != nil {
			return err
		}
	}
	if total > maxSpecBytes {
		return invalid(-1, nil, "the recipe is over %d bytes", maxSpecBytes)
	}
	return nil
}

func validateStep(i int, st *api.TemplateStep) error {
	argc := func(lo, hi int) error {
		if len(st.Args) < lo || len(st.Args) > hi {
			if lo == hi {
				return invalid(i, st, "want %d argument(s), got %d", lo, len(st.Args))
			}
			return invalid(i, st, "want %d to %d arguments, got %d", lo, hi, len(st.Args))
		}
		return nil
	}
	if st.FilesHash != "" && st.Type != api.StepCopy && st.Type != api.StepAdd {
		return invalid(i, st, "files_hash goes with COPY and ADD only")
	}
	switch st.Type {
	case api.StepRun:
		if err := argc(1, 2); err != nil {
			return err
		}
		if strings.TrimSpace(st.Args[0]) == "" {
			return invalid(i, st, "empty command")
		}
		if len(st.Args) == 2 && st.Args[1] != "" {
			return checkUser(i, st, st.Args[1])
		}
	case api.StepCopy, api.StepAdd:
		if err := argc(2, 4); err != nil {
			return err
		}
		if !filesHashRE.MatchString(st.FilesHash) {
			return invalid(i, st, "files_hash must be the hex SHA-256 of the uploaded sources")
		}
		if err := checkPath(i, st, st.Args[1]); err != nil {
			return err
		}
		if len(st.Args) > 2 && st.Args[2] != "" {
			if err := checkUser(i, st, st.Args[2]); err != nil {
				return err
			}
		}
		if len(st.Args) > 3 && st.Args[3] != "" && !octalRE.MatchString(st.Args[3]) {
			return invalid(i, st, "mode %q: want an octal mode such as 0644", errdefs.ClipN(st.Args[3], 20))
		}
	case api.StepEnv:
		if len(st.Args) == 0 || len(st.Args)%2 != 0 {
			return invalid(i, st, "want key, value pairs")
		}
		for j := 0; j < len(st.Args); j += 2 {
			if !envNameRE.MatchString(st.Args[j]) {
				return invalid(i, st, "variable name %q: want letters, digits and _", errdefs.ClipN(st.Args[j], 40))
			}
		}
	case api.StepWorkdir:
		if err := argc(1, 1); err != nil {
			return err
		}
		return checkPath(i, st, st.Args[0])
	case api.StepUser:
		if err := argc(1, 1); err != nil {
			return err
		}
		return checkUser(i, st, st.Args[0])
	default:
		return invalid(-1, nil, "step %d: unknown type %q (want RUN, COPY, ADD, ENV, WORKDIR or USER)", i+1, errdefs.ClipN(st.Type, 20))
	}
	return nil
}

// checkPath accepts an absolute path, or a relative one (resolved against
// the working directory when the step runs).
func checkPath(i int, st *api.TemplateStep, p string) error {
	if p == "" || len(p) > maxPathBytes {
		return invalid(i, st, "path: want 1 to %d bytes", maxPathBytes)
	}
	return nil
}

// userRE matches a user name, a uid, and either with ":group".
var userRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$`)

func checkUser(i int, st *api.TemplateStep, u string) error {
	if !userRE.MatchString(u) {
		return invalid(i, st, "user %q: want a name or uid, optionally with :group", errdefs.ClipN(u, 40))
	}
	return nil
}

// resolvePath makes p absolute against the working directory wd, keeping
// a trailing slash (a COPY destination that is a directory).
func resolvePath(wd, p string) string {
	if path.IsAbs(p) {
		return p
	}
	r := path.Join(wd, p)
	if strings.HasSuffix(p, "/") || p == "." {
		r += "/"
	}
	if r == "//" {
		r = "/"
	}
	return r
}

// CheckResources checks a recipe's resources against a server's limits
// (0: the server's default).
func CheckResources(spec api.TemplateSpec, l config.Limits) error {
	switch {
	case spec.CPUs < 0 || float64(spec.CPUs) > l.MaxCPUs:
		return invalid(-1, nil, "cpus %d: want 0 (the server's default) to %v", spec.CPUs, l.MaxCPUs)
	case spec.MemoryMB != 0 && (spec.MemoryMB < 64 || int64(spec.MemoryMB)*config.MiB > l.MaxMemoryBytes):
		return invalid(-1, nil, "memory_mb %d: want 0 (the server's default) or 64 to %d", spec.MemoryMB, l.MaxMemoryBytes/config.MiB)
	case spec.DiskMB != 0 && (spec.DiskMB < 64 || int64(spec.DiskMB)*config.MiB > l.MaxDiskBytes):
		return invalid(-1, nil, "disk_mb %d: want 0 (the server's default) or 64 to %d", spec.DiskMB, l.MaxDiskBytes/config.MiB)
	}
	return nil
}

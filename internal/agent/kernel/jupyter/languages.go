package jupyter

import (
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// Python runs ipykernel with the python3 found on the context's PATH.
var Python kernel.Factory = NewPython("python3")

// NewPython returns a Factory for ipykernel run by the given interpreter
// (a name looked up in the context's PATH, or a path).
func NewPython(interpreter string) kernel.Factory {
	return New(PythonSpec(interpreter))
}

// pythonStartup runs in every Python kernel as it starts: it registers
// the e2b/data (pandas DataFrames) and e2b/chart (matplotlib figures)
// formatters that E2B's result lines carry as data and chart.
//
//go:embed python_startup.py
var pythonStartup string

// pythonStartupFile is pythonStartup's name in the kernel's directory.
const pythonStartupFile = "kiln_startup.py"

// PythonSpec describes ipykernel run by interpreter. Figures come back
// as image/png display_data through matplotlib's inline backend, with no
// plt.show() needed, and with an e2b/chart description (pythonStartup).
func PythonSpec(interpreter string) Spec {
	return Spec{
		Language: "python",
		Argv: func(conn string) []string {
			return []string{interpreter, "-m", "ipykernel_launcher", "-f", conn,
				"--HistoryManager.hist_file=:memory:",
				"--IPKernelApp.exec_files=" + filepath.Join(filepath.Dir(conn), pythonStartupFile)}
		},
		Files: map[string]string{pythonStartupFile: pythonStartup},
		Env: []string{
			"MPLBACKEND=module://matplotlib_inline.backend_inline",
			"PYDEVD_DISABLE_FILE_VALIDATION=1",
			"PYTHONDONTWRITEBYTECODE=1",
		},
		SetEnv: pythonEnv,
	}
}

// pythonEnv sets os.environ for one execution and restores it after. The
// values travel base64-encoded, so no quoting can break the code; the
// saved values hang off the os module, not the user's namespace.
func pythonEnv(env map[string]string) (set, restore string) {
	b, _ := json.Marshal(env)
	set = fmt.Sprintf(`(lambda os, new: (setattr(os, "_kiln_saved_env", {k: os.environ.get(k) for k in new}), os.environ.update(new)))`+
		`(__import__("os"), __import__("json").loads(__import__("base64").b64decode("%s")))`,
		base64.StdEncoding.EncodeToString(b))
	restore = `(lambda os: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) ` +
		`for k, v in os.__dict__.pop("_kiln_saved_env", {}).items()])(__import__("os"))`
	return set, restore
}

// R runs IRkernel with the R found on the context's PATH.
var R kernel.Factory = New(RSpec("R"))

// RSpec describes IRkernel run by the R executable r.
func RSpec(r string) Spec {
	return Spec{
		Language: "r",
		Argv: func(conn string) []string {
			return []string{r, "--slave", "-e", "IRkernel::main()", "--args", conn}
		},
		SetEnv: rEnv,
	}
}

// rEnv sets the environment for one execution with Sys.setenv and
// restores it after; strings travel as raw bytes, so no quoting can break
// the code.
func rEnv(env map[string]string) (set, restore string) {
	var keys, vals []string
	for _, k := range sortedKeys(env) {
		keys = append(keys, rString(k))
		vals = append(vals, rString(env[k]))
	}
	set = fmt.Sprintf(`local({ k <- c(%s); v <- c(%s); `+
		`options(kiln.saved_env = Sys.getenv(k, unset = NA, names = TRUE)); `+
		`do.call(Sys.setenv, setNames(as.list(v), k)); invisible(NULL) })`,
		strings.Join(keys, ", "), strings.Join(vals, ", "))
	restore = `local({ s <- getOption("kiln.saved_env"); for (k in names(s)) { ` +
		`if (is.na(s[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(s[[k]]), k)) }; ` +
		`options(kiln.saved_env = NULL); invisible(NULL) })`
	return set, restore
}

// rString is an R expression for s's bytes.
func rString(s string) string {
	if s == "" {
		return `""`
	}
	hex := make([]string, len(s))
	for i := range len(s) {
		hex[i] = fmt.Sprintf("0x%02x", s[i])
	}
	return "rawToChar(as.raw(c(" + strings.Join(hex, ",") + ")))"
}

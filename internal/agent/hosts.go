package agent

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// renameHosts makes the hosts file at path name this sandbox's hostname,
// if it is exactly the one Kiln wrote (wire.Hosts) for another: a
// restored sandbox has the hosts file of the sandbox that was
// checkpointed. Any other file (the template's, or one the user changed)
// is left alone, as is anything that is not a regular file.
func renameHosts(path string) error {
	if path == "" {
		return nil
	}
	name, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("reading the hostname: %w", err)
	}
	// Not a FIFO's open that never returns, nor a link's target.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil // none, or a link: not Kiln's
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	want := wire.Hosts(name)
	b, err := io.ReadAll(io.LimitReader(f, int64(len(want))+256))
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	prefix := strings.TrimSuffix(wire.Hosts(""), "\n")
	old, ok := bytes.CutPrefix(b, []byte(prefix))
	if !ok || len(old) < 2 || bytes.IndexByte(old, '\n') != len(old)-1 || string(b) == want {
		return nil
	}
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

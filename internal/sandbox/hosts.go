package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// ensureHosts writes wire.Hosts(hostname) to etc/hosts under root, a
// fresh layer's root filesystem, unless the template has one (or has no
// /etc): no template's layers carry one (builds leave it out, as Docker
// does), and without it getaddrinfo("localhost") fails, so Python's,
// node's and Java's clients cannot reach a server in their own sandbox.
//
// It is written on the host before the sandbox first starts, so a warm
// template's or a fork's checkpoint already holds it in its layer image,
// and the restored sandbox's sentry (which trusts the dentries in its
// checkpoint) and its root filesystem agree; the restored agent renames
// its hostname in it (wire.Hosts). It resolves inside root only: a
// template's symlinks cannot point it at the host.
func ensureHosts(root, hostname string) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("opening the root filesystem: %w", err)
	}
	defer r.Close()
	if fi, err := r.Stat("etc"); err != nil || !fi.IsDir() {
		return nil // a template without /etc: nothing resolves names there
	}
	f, err := r.OpenFile("etc/hosts", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil // the template's own (or a link of it): kept
	}
	if err != nil {
		return fmt.Errorf("creating /etc/hosts: %w", err)
	}
	_, err = f.WriteString(wire.Hosts(hostname))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	return nil
}

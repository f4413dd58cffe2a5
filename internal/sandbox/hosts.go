package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// hostsFile is the /etc/hosts a sandbox gets when its template has none
// (no template's layers carry one: builds leave it out, as Docker does).
// Without it getaddrinfo("localhost") fails, and Python's, node's and
// Java's clients cannot reach a server in their own sandbox.
//
// It is the same for every sandbox, and written on the host into a fresh
// layer before the sandbox first starts: a warm template's or a fork's
// checkpoint then already holds it in its layer image, and the restored
// sandbox's sentry (which trusts the dentries in its checkpoint) and its
// root filesystem agree. It names no sandbox: a restored sandbox keeps
// its layer image's copy, which must stay right for it.
const hostsFile = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// ensureHosts writes hostsFile to etc/hosts under root, a fresh layer's
// root filesystem, unless the template has one (or has no /etc). It
// resolves inside root only: a template's symlinks cannot point it at
// the host.
func ensureHosts(root string) error {
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
	_, err = f.WriteString(hostsFile)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	return nil
}

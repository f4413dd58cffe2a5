package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// hostsContent is the /etc/hosts of a sandbox whose template has none:
// a template's layers never carry one (the builder leaves the runtime's
// files out of them), and without it getaddrinfo("localhost") fails, so
// Python's, node's and Java's clients could not reach a server the
// sandbox itself runs on localhost (curl resolves localhost on its own,
// which hid this). localhost is IPv4 only: servers in sandboxes mostly
// listen on 0.0.0.0 or 127.0.0.1, and a client that tried ::1 first (node
// does, in the resolver's order) would be refused. The sandbox's own name
// is 127.0.1.1, as Debian's installer writes it.
func hostsContent(hostname string) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n")
	if hostname != "" && hostname != "localhost" && !strings.ContainsAny(hostname, " \t\n#") {
		fmt.Fprintf(&b, "127.0.1.1\t%s\n", hostname)
	}
	return b.String()
}

// ensureHosts writes path (the sandbox's /etc/hosts) unless it exists: a
// template's own hosts file is kept. It runs when the agent starts and
// when a restored agent learns its new sandbox (identify), whose root
// filesystem is not the one the checkpointed agent wrote into.
func ensureHosts(path, hostname string) error {
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(hostsContent(hostname)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// hosts is ensureHosts for the configured file, logging a failure (a
// read-only root filesystem, say): the sandbox works on without it.
func (s *Server) hosts() {
	if s.cfg.HostsFile == "" {
		return
	}
	name, _ := os.Hostname()
	if err := ensureHosts(s.cfg.HostsFile, name); err != nil {
		s.log.Warn("writing "+s.cfg.HostsFile, "err", err)
	}
}

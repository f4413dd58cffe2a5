package e2b_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
)

// TestTemplateAptInstall runs tests/apt.test.mjs (E2B's template builder
// flow with aptInstall) with both pinned SDKs against a kiln serve of its
// own whose sandbox networking reaches the real network through a
// namespace routed to it (nettest.RealUplink): the one test of the suite
// that reaches the Debian mirror. It fails, saying so, when the mirror is
// unreachable.
func TestTemplateAptInstall(t *testing.T) {
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("template base not built (make setup): %v", err))
	requireNode(t)
	ns := nettest.RealUplink(t)
	requireMirror(t, ns, config.FromEnv().Mirror)
	srv := servetest.StartWith(t, servetest.Build(t), servetest.Options{OwnNetwork: true,
		Env: []string{"KILN_NETWORK=on", "KILN_NETWORK_HOST_NS=" + ns}})
	runPinned(t, srv, []string{"KILN_TEST_REAL_NETWORK=1"}, "apt")
}

// requireMirror fails the test unless mirror's host answers TCP from
// namespace ns.
func requireMirror(t *testing.T, ns, mirror string) {
	t.Helper()
	u, err := url.Parse(mirror)
	if err != nil || u.Host == "" {
		t.Fatalf("Debian mirror %q (KILN_MIRROR): not a URL", mirror)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := network.DialIn(ctx, ns, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		t.Fatalf("the Debian mirror %s is unreachable from this machine (%v): this test installs a package from it (set KILN_MIRROR to one that is reachable)", mirror, err)
	}
	c.Close()
}

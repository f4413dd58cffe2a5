package network_test

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
	"github.com/kiln-sh/kiln/internal/network/nettest"
)

// TestOneNetworkPerHostNS: a second Network in a host namespace that a
// live one uses is refused with a clear error and leaves the first's
// table alone; once the first closes, another may start; a Network in
// another namespace is unaffected.
func TestOneNetworkPerHostNS(t *testing.T) {
	w := nettest.New(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	n1, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n1.Close() })
	hasTable := func() bool {
		return exec.Command("ip", "netns", "exec", w.Host, "nft", "list", "table", "ip", "kiln").Run() == nil
	}
	_, err = network.New(ctx, w.Config(), log)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "another kiln serve") {
		t.Fatalf("second Network in the same namespace: %v, want a failed precondition naming another kiln serve", err)
	}
	if !hasTable() {
		t.Fatal("the refused Network removed the first one's table")
	}
	other := nettest.New(t)
	n2, err := network.New(ctx, other.Config(), log)
	if err != nil {
		t.Fatalf("a Network in another namespace: %v", err)
	}
	n2.Close()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	n3, err := network.New(ctx, w.Config(), log)
	if err != nil {
		t.Fatalf("a Network after the first closed: %v", err)
	}
	n3.Close()
}

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/network"
)

// Network modes of a sandbox.
const (
	// NetworkNone: loopback only.
	NetworkNone = "none"
	// NetworkNAT: its own address behind NAT, egress policy, DNS through
	// Kiln, exposed ports (internal/network).
	NetworkNAT = "nat"
)

// networkFile keeps a sandbox's network state in its dir, for adopt.
const networkFile = "network.json"

// NetworkOptions ask for a sandbox's network.
type NetworkOptions struct {
	// Mode is NetworkNone or NetworkNAT; "" takes the server's default.
	Mode   string
	Policy network.Policy
	// Public lets anyone reach the sandbox's exposed ports; otherwise a
	// request needs an API key of the owner or the traffic token.
	Public bool
	// MaskHost, if set, is the Host requests to its exposed ports carry
	// (network.Exposure).
	MaskHost string
}

func (o NetworkOptions) exposure() network.Exposure {
	return network.Exposure{Public: o.Public, MaskHost: o.MaskHost}
}

// NetworkInfo is a sandbox's network as the API shows it.
type NetworkInfo struct {
	Mode    string         `json:"mode"`
	Address string         `json:"address,omitempty"` // the sandbox's own (inside) address
	Policy  network.Policy `json:"policy"`
	Public  bool           `json:"public"`
	Token   string         `json:"token,omitempty"` // traffic access token
	// MaskHost is the Host requests to its exposed ports carry, "" for
	// the client's (network.Exposure).
	MaskHost string `json:"mask_host,omitempty"`
}

func networkInfo(st network.State) NetworkInfo {
	return NetworkInfo{Mode: NetworkNAT, Address: network.SandboxAddr.String(), Policy: st.Policy,
		Public: st.Public, Token: st.Token, MaskHost: st.MaskHost}
}

// resolveNetwork resolves a requested network against the template's
// default mode (tmplMode) and the server's (unset: nat when the server has
// networking, else none), and checks it can be served: nil for mode none,
// else the options with Mode NetworkNAT.
func (m *Manager) resolveNetwork(o *NetworkOptions, tmplMode string) (*NetworkOptions, error) {
	var r NetworkOptions
	if o != nil {
		r = *o
	}
	if err := network.ValidateMaskHost(r.MaskHost); err != nil {
		return nil, err
	}
	for _, mode := range []string{tmplMode, m.cfg.Network.DefaultMode} {
		if r.Mode == "" {
			r.Mode = mode
		}
	}
	if r.Mode == "" && m.cfg.Net != nil {
		r.Mode = NetworkNAT // networking is up: E2B-like egress by default
	}
	switch r.Mode {
	case "", NetworkNone:
		if r.MaskHost != "" {
			return nil, fmt.Errorf("a mask host needs network mode nat (this sandbox's is none): %w", errdefs.ErrFailedPrecondition)
		}
		return nil, nil
	case NetworkNAT:
		if m.cfg.Net == nil {
			return nil, fmt.Errorf("network mode nat: this server has no sandbox networking: %w", errdefs.ErrFailedPrecondition)
		}
		if err := r.Policy.Validate(); err != nil {
			return nil, err
		}
		return &r, nil
	default:
		return nil, fmt.Errorf("network mode %q: want none or nat: %w", r.Mode, errdefs.ErrInvalidArgument)
	}
}

// attachNetwork gives sandbox b the network o (from resolveNetwork; nil:
// none), records it in b's dir and pushes its undo step: the network
// stage of bring-up path (pipeline.go).
func (m *Manager) attachNetwork(ctx context.Context, path string, b *box, o *NetworkOptions, c *cleanup) error {
	if o == nil {
		return nil
	}
	if err := m.fault(path, stageNetwork, b.rec.ID); err != nil {
		return err
	}
	id := b.rec.ID.String()
	st, err := m.cfg.Net.Attach(ctx, id, o.Policy, o.exposure())
	if err != nil {
		return fmt.Errorf("making sandbox network: %w", err)
	}
	c.add(func(ctx context.Context) error { return m.cfg.Net.Detach(ctx, id) })
	return saveNetwork(b.dir, st)
}

// Networking reports whether this Manager's sandboxes can have a network
// (kiln serve set sandbox networking up).
func (m *Manager) Networking() bool { return m.cfg.Net != nil }

// claimNetwork gives unlisted sandbox b, which has the network a pool
// made it with, the policy and exposure of the create claiming it (o,
// from resolveNetwork), before anyone can use it.
func (m *Manager) claimNetwork(ctx context.Context, b *box, o *NetworkOptions) error {
	st, err := m.cfg.Net.SetPolicy(ctx, b.rec.ID.String(), o.Policy, o.exposure())
	if err != nil {
		return fmt.Errorf("setting the pooled sandbox's network: %w", err)
	}
	return saveNetwork(b.dir, st)
}

// netNS is the network namespace path a sandbox's spec joins, or "".
func (m *Manager) netNS(id ID) string {
	if m.cfg.Net == nil || !m.cfg.Net.Has(id.String()) {
		return ""
	}
	return network.NSPath(network.SandboxNS(id.String()))
}

// configureDNS points a networked sandbox's resolver at its gateway.
func (m *Manager) configureDNS(ctx context.Context, id ID, conn *channel.Conn) error {
	if m.netNS(id) == "" {
		return nil
	}
	a := &Agent{conn: conn}
	if _, err := a.WriteFile(ctx, wire.WriteParams{Path: "/etc/resolv.conf", User: "root"},
		strings.NewReader(network.ResolvConf)); err != nil {
		return fmt.Errorf("writing resolv.conf: %w", err)
	}
	return nil
}

// detachNetwork removes a sandbox's network, if it has one (also when
// this server runs without networking but an earlier one made it).
func (m *Manager) detachNetwork(ctx context.Context, id ID) error {
	if m.cfg.Net == nil {
		return network.Remove(ctx, id.String())
	}
	return m.cfg.Net.Detach(ctx, id.String())
}

// adoptNetwork takes over the network of a re-adopted sandbox, if its dir
// says it has one; with rebuild it is made again if it is gone.
func (m *Manager) adoptNetwork(ctx context.Context, id ID, dir string, rebuild bool) error {
	data, err := os.ReadFile(filepath.Join(dir, networkFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading network state: %w", err)
	}
	var st network.State
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("decoding network state: %w", err)
	}
	if m.cfg.Net == nil {
		return errors.New("it has a network and this server has no sandbox networking")
	}
	return m.cfg.Net.Adopt(ctx, id.String(), st, rebuild)
}

func saveNetwork(dir string, st network.State) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+networkFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("saving network state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, networkFile))
}

// Network returns a sandbox's network settings.
func (m *Manager) Network(id ID) (NetworkInfo, error) {
	if _, err := m.box(id); err != nil {
		return NetworkInfo{}, err
	}
	if m.netNS(id) == "" {
		return NetworkInfo{Mode: NetworkNone}, nil
	}
	st, err := m.cfg.Net.State(id.String())
	if err != nil {
		return NetworkInfo{}, err
	}
	return networkInfo(st), nil
}

// SetNetwork changes a live sandbox's egress policy, limits and whether
// its ports are public. The mode cannot change.
func (m *Manager) SetNetwork(ctx context.Context, id ID, o NetworkOptions) (NetworkInfo, error) {
	b, err := m.box(id)
	if err != nil {
		return NetworkInfo{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != StateRunning && b.rec.State != StatePaused {
		return NetworkInfo{}, fmt.Errorf("sandbox %s is %s: %w", id, b.rec.State, errdefs.ErrFailedPrecondition)
	}
	if m.netNS(id) == "" {
		return NetworkInfo{}, fmt.Errorf("sandbox %s has no network (mode none); its mode cannot change: %w", id, errdefs.ErrFailedPrecondition)
	}
	if o.Mode != "" && o.Mode != NetworkNAT {
		return NetworkInfo{}, fmt.Errorf("network mode cannot change on a live sandbox: %w", errdefs.ErrInvalidArgument)
	}
	st, err := m.cfg.Net.SetPolicy(ctx, id.String(), o.Policy, o.exposure())
	if err != nil {
		return NetworkInfo{}, err
	}
	if err := saveNetwork(b.dir, st); err != nil {
		return NetworkInfo{}, err
	}
	m.log.Info("sandbox network changed", "sandbox_id", id, "egress", st.Policy.Egress,
		"allow", len(st.Policy.Allow), "deny", len(st.Policy.Deny), "public", st.Public)
	return networkInfo(st), nil
}

// DialPort connects to a port a process in a running sandbox listens on:
// on its network address (0.0.0.0 or the sandbox's address) when it has a
// network; otherwise, or when nothing listens there (a server bound to
// 127.0.0.1), on its loopback through the agent channel (Agent.Tunnel).
func (m *Manager) DialPort(ctx context.Context, id ID, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: %w", port, errdefs.ErrInvalidArgument)
	}
	b, err := m.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	state := b.rec.State
	b.mu.Unlock()
	if state != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, state, errdefs.ErrUnavailable)
	}
	if m.netNS(id) != "" {
		c, err := m.cfg.Net.Dial(ctx, id.String(), port)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("connecting to port %d of sandbox %s: %w: %w", port, id, errdefs.ErrUnavailable, err)
		}
	}
	a, err := m.Agent(id)
	if err != nil {
		return nil, err
	}
	c, err := a.Tunnel(ctx, port)
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d of sandbox %s: %w: %w", port, id, errdefs.ErrUnavailable, err)
	}
	return c, nil
}

// NetworkStats returns a networked sandbox's traffic counters.
func (m *Manager) NetworkStats(ctx context.Context, id ID) (network.Stats, error) {
	if m.netNS(id) == "" {
		return network.Stats{}, fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	return m.cfg.Net.Stats(ctx, id.String())
}

// keepNetwork copies a networked sandbox's network state from its dir into
// an image dir (capture), so that sandboxes restored from the image get a
// network with the same policy.
func keepNetwork(srcDir, imageDir string) error {
	data, err := os.ReadFile(filepath.Join(srcDir, networkFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading network state: %w", err)
	}
	return os.WriteFile(filepath.Join(imageDir, networkFile), data, 0o600)
}

// attachRestored gives b, restored from the image in imageDir, a network
// of its own with the image's policy if the image's sandbox had one. Its
// netstack comes back with the source's inside address, which is every
// sandbox's, so nothing needs renumbering; it gets its own outer address
// and traffic token.
func (m *Manager) attachRestored(ctx context.Context, b *box, imageDir string, c *cleanup) error {
	data, err := os.ReadFile(filepath.Join(imageDir, networkFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading network state: %w", err)
	}
	var st network.State
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("decoding network state: %w", err)
	}
	if m.cfg.Net == nil {
		return fmt.Errorf("the image is of a sandbox with a network and this server has no sandbox networking: %w", errdefs.ErrFailedPrecondition)
	}
	return m.attachNetwork(ctx, pathRestore, b, &NetworkOptions{Mode: NetworkNAT, Policy: st.Policy, Public: st.Public,
		MaskHost: st.MaskHost}, c)
}

// readdressNetwork prepares a networked sandbox's namespace for a runsc
// restore into it (see network.Readdress).
func (m *Manager) readdressNetwork(ctx context.Context, id ID) error {
	if m.netNS(id) == "" {
		return nil
	}
	return m.cfg.Net.Readdress(ctx, id.String())
}

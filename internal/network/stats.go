package network

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Stats are a sandbox's network counters since its network was made.
type Stats struct {
	SentBytes     uint64 // from the sandbox (uploads, requests)
	ReceivedBytes uint64 // to the sandbox
	Connections   uint64 // connections (flows) the sandbox opened
	Drops         uint64 // packets its policy or limits refused
}

var counterRE = regexp.MustCompile(`counter (\w+) \{\s*packets (\d+) bytes (\d+)`)

// Stats reads sandbox id's counters.
func (n *Network) Stats(ctx context.Context, id string) (Stats, error) {
	ep, err := n.endpoint(id)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	var dev []byte
	if err := inNS(n.cfg.HostNS, func() error {
		var err error
		dev, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	}); err != nil {
		return Stats{}, fmt.Errorf("reading link counters: %w", err)
	}
	link := hostLink(ep.slot) + ":"
	for line := range strings.Lines(string(dev)) {
		f := strings.Fields(line)
		if len(f) >= 10 && f[0] == link {
			// The host side's receive is the sandbox's send.
			st.SentBytes, _ = strconv.ParseUint(f[1], 10, 64)
			st.ReceivedBytes, _ = strconv.ParseUint(f[9], 10, 64)
		}
	}
	out, err := nsOutput(ctx, routerNS(id), "nft", "list", "counters", "table", "ip", "kiln")
	if err != nil {
		return Stats{}, fmt.Errorf("reading policy counters: %w", err)
	}
	for _, m := range counterRE.FindAllStringSubmatch(string(out), -1) {
		packets, _ := strconv.ParseUint(m[2], 10, 64)
		switch m[1] {
		case "drops":
			st.Drops = packets
		case "conns":
			st.Connections = packets
		}
	}
	return st, nil
}

// Attached lists the ids of the sandboxes with a network.
func (n *Network) Attached() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.eps))
	for id := range n.eps {
		out = append(out, id)
	}
	return out
}

package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// maxMoveTries bounds how often a front reads a sandbox's record again
// after another front (or its node) changed it under a move.
const maxMoveTries = 3

// liveNodeOf is the serving (live or draining, and answering) node to send an owner's request about sb to: its
// node; or, when its node is not live (lost) and sb is paused with its
// image in the shared snapshot dir, another live node with sb's runtime,
// to which sb's record is moved first. The move is a compare-and-swap on
// the record's node (cluster.Store.MoveSandbox): of fronts moving it at
// once, one does, and the others read the record again and follow it to
// its new node. The node takes the sandbox over from the shared snapshot
// dir on the request (sandbox.Manager's claim). Anything else on a node
// that is not live is unavailable.
func (s *Server) liveNodeOf(ctx context.Context, sb sandbox.Sandbox) (cluster.Node, error) {
	for range maxMoveTries {
		n, err := s.front.dir.Node(ctx, sb.Node)
		if errors.Is(err, errdefs.ErrNotFound) {
			return n, fmt.Errorf("sandbox %s: its node %s is not in the catalog: %w", sb.ID, sb.Node, errdefs.ErrUnavailable)
		}
		if err != nil {
			return n, err
		}
		if n.Serving() {
			if err := s.front.dir.Answering(n); err != nil {
				return n, fmt.Errorf("sandbox %s: %w", sb.ID, err)
			}
			return n, nil
		}
		if sb.State != sandbox.StatePaused || sb.Image == "" {
			return n, fmt.Errorf("sandbox %s: its node %s is %s: %w", sb.ID, n.Name, n.State, errdefs.ErrUnavailable)
		}
		to, err := s.moveTarget(ctx, sb)
		if err != nil {
			return to, fmt.Errorf("sandbox %s: its node %s is %s, and %w", sb.ID, n.Name, n.State, err)
		}
		err = s.front.nodes.MoveSandbox(ctx, sb.ID.String(), sb.Node, to.Name)
		if err == nil {
			s.log.Info("moved a paused sandbox off a node that is not live", "sandbox_id", sb.ID, "from", sb.Node, "to", to.Name)
			return to, nil
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return to, err
		}
		// Moved by another front, resumed or ended meanwhile: follow it.
		if sb, err = s.front.store.GetSandbox(ctx, sb.ID); err != nil {
			return cluster.Node{}, fmt.Errorf("looking up sandbox: %w", err)
		}
		if sb.State.Terminal() {
			return cluster.Node{}, sb.Running()
		}
	}
	return cluster.Node{}, fmt.Errorf("sandbox %s changed under every move: %w", sb.ID, errdefs.ErrUnavailable)
}

// moveTarget picks the live node a moved sandbox goes to: the least
// loaded of a sample with its runtime and a free slot (cluster.Place).
func (s *Server) moveTarget(ctx context.Context, sb sandbox.Sandbox) (cluster.Node, error) {
	nodes, err := s.front.dir.Nodes(ctx)
	if err != nil {
		return cluster.Node{}, err
	}
	order, err := cluster.Place(nodes, cluster.Want{Runtime: sb.Runtime}, s.front.k)
	if err != nil {
		return cluster.Node{}, fmt.Errorf("no other node can resume it: %w", err)
	}
	return order[0], nil
}

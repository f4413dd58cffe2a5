package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// E2B's signed file URLs without a sandbox host (sandbox.downloadUrl()
// and uploadUrl() when the sandbox URL is the API's): GET or POST /files
// with a signature made from the sandbox's access token, which names no
// sandbox. A node finds the sandbox by trying each of its own
// (e2b.Handler.Signer); a front asks every live node at once which of its
// sandboxes signed the URL (GET /v1/cluster/signer/{op}, a node-only
// route behind the cluster token) and routes the request to that one by
// E2B's headers, where envd checks the signature again.

// signerTimeout bounds a front's question to the nodes. A node answers
// once it has read its live sandboxes, which waits for any of them busy
// being created, paused or killed: seconds on a loaded node.
const signerTimeout = 30 * time.Second

// signerAnswer is a node's answer: the sandbox that signed the URL.
type signerAnswer struct {
	SandboxID string `json:"sandbox_id"`
}

// signer answers a front (GET /v1/cluster/signer/{op}, the signed URL's
// query, op read for GET and write for POST): which running sandbox of
// this node signed it; not_found if none.
func (s *Server) signer(w http.ResponseWriter, r *http.Request) error {
	method := map[string]string{"read": http.MethodGet, "write": http.MethodPost}[r.PathValue("op")]
	if method == "" {
		return invalid("op: want read or write")
	}
	if s.e2b == nil {
		return fmt.Errorf("no E2B API here: %w", errdefs.ErrUnavailable)
	}
	files := r.Clone(r.Context())
	files.Method, files.URL.Path, files.Body = method, "/files", http.NoBody
	sb, ok := s.e2b.Signer(files)
	if !ok {
		return fmt.Errorf("no sandbox of this node signed the URL: %w", errdefs.ErrNotFound)
	}
	return writeJSON(w, http.StatusOK, signerAnswer{SandboxID: sb.ID.String()})
}

// frontSignedFiles routes a signed /files URL to the node whose sandbox
// signed it, as a request for that sandbox's envd.
func (s *Server) frontSignedFiles(w http.ResponseWriter, r *http.Request) error {
	r.Pattern = "E2B signed /files (front)"
	// A signature the front cannot check costs every node a question:
	// held to the cap on requests without credentials.
	if err := s.edge.Admit(r, false); err != nil {
		w.Header().Set("Connection", "close")
		return err
	}
	ns, err := s.front.dir.Nodes(r.Context())
	if err != nil {
		return err
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	ctx, cancel := context.WithTimeout(r.Context(), signerTimeout)
	defer cancel()
	type found struct {
		n  cluster.Node
		id string
	}
	answers, asked := make(chan found), 0
	for _, n := range ns {
		if n.State != cluster.NodeLive {
			continue
		}
		asked++
		go func() {
			id := s.askSigner(ctx, r, n, op)
			select {
			case answers <- found{n, id}:
			case <-ctx.Done():
			}
		}()
	}
	for range asked {
		var f found
		select {
		case f = <-answers:
		case <-ctx.Done():
		}
		if f.id == "" {
			continue
		}
		cancel() // the others need not answer
		e2b.RouteByHeaders(r, f.id, e2b.EnvdPort)
		s.front.proxy.Forward(w, r, f.n, s.e2bProblem)
		return nil
	}
	e2b.RefuseSigned(w, r)
	return nil
}

// askSigner asks node n which of its sandboxes signed r ("" if none, or
// no answer).
func (s *Server) askSigner(ctx context.Context, r *http.Request, n cluster.Node, op string) string {
	q := r.Clone(ctx)
	q.Method, q.URL.Path = http.MethodGet, "/v1/cluster/signer/"+op
	resp, err := s.front.proxy.Send(ctx, q, nil, n)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var a signerAnswer
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&a) != nil {
		return ""
	}
	return a.SandboxID
}

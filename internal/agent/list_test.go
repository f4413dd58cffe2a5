package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// list collects a MethodList call's batches of entries.
func (h *harness) list(p wire.ListParams) ([]api.FileInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodList, p)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var out []api.FileInfo
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		var batch []api.FileInfo
		if f.Type != channel.FrameEvent || json.Unmarshal(f.Payload, &batch) != nil || len(batch) > wire.ListBatch {
			return nil, fmt.Errorf("unexpected frame %+v", f)
		}
		out = append(out, batch...)
	}
	return out, st.Wait(ctx, nil)
}

// TestListLarge: a listing far larger than one channel frame arrives
// whole, in batches.
func TestListLarge(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	const n = 3000
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("file-with-a-longish-name-%04d.txt", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list, err := h.list(wire.ListParams{Path: dir, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n || list[0].Name != "file-with-a-longish-name-0000.txt" || list[n-1].Name != fmt.Sprintf("file-with-a-longish-name-%04d.txt", n-1) {
		t.Fatalf("%d entries", len(list))
	}
	if b, _ := json.Marshal(list); len(b) <= channel.MaxPayload {
		t.Fatalf("the listing is only %d bytes: not larger than a frame", len(b))
	}
}

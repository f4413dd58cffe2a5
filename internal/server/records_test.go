package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/page"
)

// TestCreateMetadataCaps: metadata over the caps (and env over its total)
// is a 400 invalid_argument with a short message that does not echo the
// input; metadata at the caps makes a sandbox.
func TestCreateMetadataCaps(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	pairs := func(n, valueLen int) map[string]string {
		md := map[string]string{}
		for i := range n {
			md[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", valueLen)
		}
		return md
	}
	for _, tc := range []struct {
		name string
		req  api.CreateSandboxRequest
	}{
		{"65 pairs", api.CreateSandboxRequest{Metadata: pairs(sandbox.MaxMetadataPairs+1, 1)}},
		{"key of 257 bytes", api.CreateSandboxRequest{Metadata: map[string]string{strings.Repeat("k", 257): "v"}}},
		{"value of 4 KiB + 1", api.CreateSandboxRequest{Metadata: map[string]string{"k": strings.Repeat("v", 4<<10+1)}}},
		{"20 KiB in all", api.CreateSandboxRequest{Metadata: pairs(5, 4<<10)}},
		{"900 KiB (under the body limit)", api.CreateSandboxRequest{Metadata: pairs(225, 4<<10)}},
		{"env of 90 KiB", api.CreateSandboxRequest{Env: map[string]string{"A": strings.Repeat("a", 30<<10), "B": strings.Repeat("b", 30<<10), "C": strings.Repeat("c", 30<<10)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.with(t)
			var e api.Error
			h.do("POST", "/v1/sandboxes", h.a, tc.req, http.StatusBadRequest, &e)
			if e.Code != "invalid_argument" || len(e.Message) > 200 || strings.Contains(e.Message, strings.Repeat("v", 64)) ||
				!strings.Contains(e.Message, "metadata") && !strings.Contains(e.Message, "env") {
				t.Errorf("error %+v, want a short invalid_argument about metadata or env", e)
			}
		})
	}
	if !h.sandbox {
		t.Log("no sandboxes here: the create at the caps is not tried")
		return
	}
	md := pairs(sandbox.MaxMetadataPairs, sandbox.MaxMetadataBytes/sandbox.MaxMetadataPairs-4)
	sb := h.create(h.a, api.CreateSandboxRequest{Metadata: md})
	if len(sb.Metadata) != sandbox.MaxMetadataPairs {
		t.Errorf("created with %d metadata pairs, want %d", len(sb.Metadata), sandbox.MaxMetadataPairs)
	}
}

// TestListBounded puts more ended sandboxes than the largest page into
// the store for one key: a list answers at most the largest page and a
// token, never all of them, and the pages add up to every record once.
func TestListBounded(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	ctx := context.Background()
	k, secret := apikey.New("many", false)
	if err := h.store.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	const n = page.MaxSize + 100
	start := time.Now().Add(-time.Hour)
	for i := range n {
		sb := sandbox.Sandbox{ID: sandbox.ID(fmt.Sprintf("bound%07d", i)), Template: "base", Runtime: "runc",
			State: sandbox.StateStopped, Reason: "killed", Owner: k.ID, CreatedAt: start.Add(time.Duration(i) * time.Millisecond),
			Metadata: map[string]string{"pad": strings.Repeat("p", 4<<10)}}
		if err := h.store.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	list := func(query string) api.SandboxList {
		t.Helper()
		var l api.SandboxList
		h.do("GET", "/v1/sandboxes"+query, secret, nil, http.StatusOK, &l)
		return l
	}
	if l := list(""); len(l.Sandboxes) != page.DefaultSize || l.NextPageToken == "" {
		t.Errorf("default page: %d sandboxes, token %q; want %d and a token", len(l.Sandboxes), l.NextPageToken, page.DefaultSize)
	}
	h.do("GET", fmt.Sprintf("/v1/sandboxes?limit=%d", page.MaxSize+1), secret, nil, http.StatusBadRequest, nil)
	seen := map[string]bool{}
	q := fmt.Sprintf("?state=stopped&limit=%d", page.MaxSize)
	for pages := 0; ; pages++ {
		if pages > 2 {
			t.Fatal("more pages than records allow")
		}
		l := list(q)
		if len(l.Sandboxes) > page.MaxSize {
			t.Fatalf("page of %d sandboxes, at most %d", len(l.Sandboxes), page.MaxSize)
		}
		for _, sb := range l.Sandboxes {
			if seen[sb.ID] {
				t.Errorf("%s listed twice", sb.ID)
			}
			seen[sb.ID] = true
			if sb.Metadata != nil || sb.State != "stopped" {
				t.Errorf("ended sandbox listed as %+v, want stopped without metadata", sb)
			}
		}
		if l.NextPageToken == "" {
			break
		}
		q = fmt.Sprintf("?state=stopped&limit=%d&page_token=%s", page.MaxSize, url.QueryEscape(l.NextPageToken))
	}
	if len(seen) != n {
		t.Errorf("pages listed %d sandboxes, want %d", len(seen), n)
	}
	// The other key sees none of them.
	resp := h.request("GET", "/v1/sandboxes", h.b, nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var other api.SandboxList
	if err := json.Unmarshal(b, &other); err != nil || len(other.Sandboxes) != 0 {
		t.Errorf("another key's list: %s, %v", b, err)
	}
}

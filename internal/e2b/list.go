package e2b

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// List page sizes (E2B's), the page of the unpaged v1 list, and the
// longest page token a client may send back.
const (
	defaultListLimit = 100
	maxListLimit     = 100
	maxListV1        = 1000
	maxTokenBytes    = 512
)

// listV1 is the deprecated GET /sandboxes: the caller's running
// sandboxes matching ?metadata=, in one page. E2B's has no pages; Kiln's
// is one store page of at most maxListV1 (the oldest), which is more than
// a key's default quota of live sandboxes.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, c Caller) error {
	md, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	sbs, _, err := h.m.List(r.Context(), sandbox.Filter{
		Owner: c.Owner, States: []sandbox.State{sandbox.StateRunning}, Metadata: md, Limit: maxListV1,
	})
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV2 is GET /v2/sandboxes: ?state=running,paused &metadata=
// &template= &startedAfter= &limit= &nextToken= &order=asc|desc (by start
// time, newest first by default), with X-Next-Token while more pages
// exist. Every filter and the page bound go to the store: one page is
// one bounded query, however many records the caller has.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, c Caller) error {
	q := r.URL.Query()
	states, err := stateFilter(q["state"])
	if err != nil {
		return err
	}
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	f := sandbox.Filter{
		Owner: c.Owner, States: states, Metadata: md, Limit: limit,
		Desc: q.Get("order") != "asc", Token: q.Get("nextToken"),
	}
	if len(f.Token) > maxTokenBytes {
		return fmt.Errorf("nextToken %q is not one this server made: %w", errdefs.ClipN(f.Token, 40), errdefs.ErrInvalidArgument)
	}
	if tmpl := q.Get("template"); tmpl != "" {
		f.Template = kilnTemplate(tmpl)
	}
	if after := q.Get("startedAfter"); after != "" {
		t, err := time.Parse(time.RFC3339, after)
		if err != nil {
			return fmt.Errorf("startedAfter %q: want RFC 3339: %w", errdefs.ClipN(after, 40), errdefs.ErrInvalidArgument)
		}
		// Inclusive, as on E2B: a sandbox started at exactly that instant
		// (at the microseconds the store keeps and startedAt shows) is
		// listed; the store's bound is exclusive.
		f.CreatedAfter = t.Truncate(time.Microsecond).Add(-time.Microsecond)
	}
	sbs, next, err := h.m.List(r.Context(), f)
	if errors.Is(err, errdefs.ErrInvalidArgument) && f.Token != "" {
		return fmt.Errorf("nextToken %q is not one this server made: %w", errdefs.ClipN(f.Token, 40), errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, listed(sb))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// stateFilter parses ?state=running,paused (comma-joined or repeated);
// none means both.
func stateFilter(vals []string) ([]sandbox.State, error) {
	var out []sandbox.State
	for _, v := range vals {
		for s := range strings.SplitSeq(v, ",") {
			switch st := sandbox.State(strings.TrimSpace(s)); st {
			case sandbox.StateRunning, sandbox.StatePaused:
				if !slices.Contains(out, st) {
					out = append(out, st)
				}
			default:
				return nil, fmt.Errorf("state %q: want running or paused: %w", errdefs.ClipN(s, 20), errdefs.ErrInvalidArgument)
			}
		}
	}
	if len(out) == 0 {
		out = []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}
	}
	return out, nil
}

// metadataFilter decodes the SDKs' ?metadata=: after the query's own
// decoding, the value is a URL-encoded k=v&k=v string whose keys and
// values are URL-encoded once more.
func metadataFilter(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	bad := fmt.Errorf("metadata filter %q: want URL-encoded key=value pairs: %w", errdefs.ClipN(raw, 64), errdefs.ErrInvalidArgument)
	whole, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, bad
	}
	md := map[string]string{}
	for pair := range strings.SplitSeq(whole, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, bad
		}
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, bad
		}
		if v, err = url.QueryUnescape(v); err != nil {
			return nil, bad
		}
		md[k] = v
	}
	return md, nil
}

// paginate sorts items by time (then id, both from key) and returns the
// page after token, and the token of the next page ("" on the last). A
// token names the last item of its page, so pages stay consistent when
// items come and go in between.
func paginate[T any](items []T, key func(T) (time.Time, string), desc bool, token string, limit int) ([]T, string, error) {
	cmpKeys := func(at time.Time, aid string, bt time.Time, bid string) int {
		c := cmp.Or(at.Compare(bt), strings.Compare(aid, bid))
		if desc {
			return -c
		}
		return c
	}
	slices.SortFunc(items, func(a, b T) int {
		at, aid := key(a)
		bt, bid := key(b)
		return cmpKeys(at, aid, bt, bid)
	})
	if token != "" {
		lt, lid, err := decodeToken(token)
		if err != nil {
			return nil, "", err
		}
		i := 0
		for i < len(items) {
			t, id := key(items[i])
			if cmpKeys(t, id, lt, lid) > 0 {
				break
			}
			i++
		}
		items = items[i:]
	}
	if len(items) <= limit {
		return items, "", nil
	}
	t, id := key(items[limit-1])
	next := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d.%s", t.UnixNano(), id))
	return items[:limit], next, nil
}

func decodeToken(token string) (time.Time, string, error) {
	bad := fmt.Errorf("nextToken %q is not one this server made: %w", errdefs.ClipN(token, 40), errdefs.ErrInvalidArgument)
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return time.Time{}, "", bad
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", bad
	}
	return time.Unix(0, n).UTC(), id, nil
}

// pageLimit parses ?limit= (default and maximum E2B's).
func pageLimit(s string) (int, error) {
	if s == "" {
		return defaultListLimit, nil
	}
	limit, err := strconv.Atoi(s)
	if err != nil || limit < 1 || limit > maxListLimit {
		return 0, fmt.Errorf("limit %q: want 1 to %d: %w", errdefs.ClipN(s, 10), maxListLimit, errdefs.ErrInvalidArgument)
	}
	return limit, nil
}

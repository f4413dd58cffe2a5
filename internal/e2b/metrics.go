package e2b

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// metrics is GET /sandboxes/{id}/metrics?start=&end= (unix seconds,
// both optional): Kiln keeps no history, so the answer is one sample
// taken now if now is within [start, end], else none (and none for a
// paused sandbox).
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, c Caller) error {
	start, end, err := metricsWindow(r.URL.Query())
	if err != nil {
		return err
	}
	sb, err := h.lookup(r, c)
	if err != nil {
		return err
	}
	out := []sandboxMetric{}
	if now := time.Now().Unix(); sb.State == sandbox.StateRunning && now >= start && now <= end {
		mt, err := h.sample(r.Context(), sb)
		if err != nil {
			return err
		}
		out = append(out, mt)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// metricsWindow parses ?start= and ?end= (unix seconds; the SDKs round
// their dates to seconds); a missing bound is open.
func metricsWindow(q url.Values) (start, end int64, err error) {
	start, end = math.MinInt64, math.MaxInt64
	for _, b := range []struct {
		name string
		v    *int64
	}{{"start", &start}, {"end", &end}} {
		raw := q.Get(b.name)
		if raw == "" {
			continue
		}
		if *b.v, err = strconv.ParseInt(raw, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("%s %q: want unix seconds: %w", b.name, errdefs.ClipN(raw, 20), errdefs.ErrInvalidArgument)
		}
	}
	if start > end {
		return 0, 0, fmt.Errorf("start %d is after end %d: %w", start, end, errdefs.ErrInvalidArgument)
	}
	return start, end, nil
}

// metricsMany is GET /sandboxes/metrics?sandbox_ids=a,b: the latest
// sample of each of the caller's running sandboxes named.
func (h *Handler) metricsMany(w http.ResponseWriter, r *http.Request, c Caller) error {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) > 100 {
		return fmt.Errorf("at most 100 sandbox_ids: %w", errdefs.ErrInvalidArgument)
	}
	out := map[string]sandboxMetric{}
	for _, raw := range ids {
		id, err := sandbox.ParseID(strings.TrimSpace(raw))
		if err != nil {
			continue
		}
		sb, err := h.m.Get(r.Context(), id)
		if err != nil || sb.Owner != c.Owner || sb.State != sandbox.StateRunning {
			continue
		}
		if mt, err := h.sample(r.Context(), sb); err == nil {
			out[id.String()] = mt
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// sample measures a running sandbox now.
func (h *Handler) sample(ctx context.Context, sb sandbox.Sandbox) (sandboxMetric, error) {
	u, err := h.m.Usage(ctx, sb.ID)
	if err != nil {
		return sandboxMetric{}, fmt.Errorf("reading usage: %w", err)
	}
	now := time.Now().UTC()
	cpus := cpuCount(sb.Limits.CPUs)
	return sandboxMetric{
		Timestamp: stampOf(now), TimestampUnix: now.Unix(), CPUCount: cpus,
		CPUUsedPct: h.usage.percent(sb, u.CPUSeconds, now, cpus),
		MemUsed:    u.MemoryBytes, MemTotal: u.MemoryLimit,
		DiskUsed: u.DiskBytes, DiskTotal: u.DiskLimit,
	}, nil
}

// cpuSampler turns a sandbox's cumulative CPU time into a percentage
// over the time since its previous sample (or since it started).
type cpuSampler struct {
	mu   sync.Mutex
	last map[sandbox.ID]cpuSample
}

type cpuSample struct {
	at      time.Time
	seconds float64
}

func newCPUSampler() *cpuSampler { return &cpuSampler{last: map[sandbox.ID]cpuSample{}} }

func (s *cpuSampler) percent(sb sandbox.Sandbox, seconds float64, now time.Time, cpus int) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.last[sb.ID]
	if !ok || seconds < prev.seconds {
		prev = cpuSample{at: sb.CreatedAt}
	}
	if len(s.last) > 10000 {
		clear(s.last)
	}
	s.last[sb.ID] = cpuSample{at: now, seconds: seconds}
	wall := now.Sub(prev.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return min(100, 100*(seconds-prev.seconds)/wall/float64(cpus))
}

// Package edge is the HTTP edge that both of kiln serve's front ends
// serve behind: the native API (internal/server) and E2B's (internal/e2b
// with envd). Whatever API a request belongs to, the edge gives it its id
// and log line, and measures it (Handler); records which sandbox it is
// about (Annotate); authenticates its API key over the Keys seam
// (Authenticate); caps requests without credentials (Admit); bounds
// connections and request bodies (HTTPServer, config.Edge); and decides
// what a client may see of an error (Problem): its API code (errdefs'
// table) and HTTP status (api's), a classified error's message with host
// directories scrubbed, and for an unclassified one a generic message
// with the request id while the real error goes to the log.
//
// The front ends translate the edge's answer into their wire shapes
// (api.Error, E2B's {code, message}, Connect errors); none keeps its own
// table of error classes.
package edge

import (
	"log/slog"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/metrics"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// Options configure an Edge.
type Options struct {
	// Log gets the request log and the internal errors; nil discards.
	Log *slog.Logger
	// Keys looks API keys up; nil: no keys, every request needing one is
	// refused.
	Keys Keys
	// Metrics may be nil: nothing is recorded.
	Metrics *metrics.Metrics
	// Config bounds connections, bodies and anonymous requests; zero
	// fields take config's defaults.
	Config config.Edge
	// DefaultQuota is the quota of a key that sets no limits of its own.
	DefaultQuota sandbox.Quota
	// Scrub are host directories (the data and run dirs) that a message a
	// client sees never names.
	Scrub []string
}

// Edge is the HTTP edge of one server. Its methods that the front ends
// call on a request (Authenticate, Admit, Problem, Public, Internal,
// ObserveCreate) also work on a nil *Edge: no keys, no cap, no log.
type Edge struct {
	log     *slog.Logger
	keys    Keys
	metrics *metrics.Metrics
	cfg     config.Edge
	quota   sandbox.Quota
	scrub   []string
	anon    chan struct{} // slots of requests without credentials (Admit)
	conns   *connTracker
}

// New returns an Edge.
func New(o Options) *Edge {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	cfg := o.Config.WithDefaults()
	return &Edge{
		log: o.Log, keys: o.Keys, metrics: o.Metrics, cfg: cfg, quota: o.DefaultQuota, scrub: o.Scrub,
		anon: make(chan struct{}, cfg.MaxAnonymous), conns: newConnTracker(cfg.MaxPendingConns),
	}
}

// bare is what a nil *Edge does.
var bare = New(Options{})

func (e *Edge) or() *Edge {
	if e == nil {
		return bare
	}
	return e
}

package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// CodePort is the port of E2B's code-interpreter service in a sandbox.
// Kiln's host serves that API itself (package e2b), but programs inside
// the sandbox, such as a template's ready check
// (waitForURL("http://localhost:49999/health")), expect the port to
// answer there too.
const CodePort = 49999

// ipykernelDirs are where a template's system Python keeps ipykernel: a
// root filesystem with it is a code interpreter's.
var ipykernelDirs = []string{
	"/usr/lib/python3/dist-packages/ipykernel",
	"/usr/local/lib/python3*/dist-packages/ipykernel",
	"/usr/local/lib/python3*/site-packages/ipykernel",
}

// defaultCodeHealth is the address the code-interpreter health check is
// served on by default: E2B's port on every interface in a sandbox whose
// root filesystem has the Python kernel, nowhere otherwise. Only the
// sandbox's agent (PID 1) serves it; an agent embedded in a program on
// the host (tests) does not.
func defaultCodeHealth() string {
	if os.Getpid() != 1 {
		return ""
	}
	for _, pattern := range ipykernelDirs {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return net.JoinHostPort("0.0.0.0", "49999")
		}
	}
	return ""
}

// serveCodeHealth answers GET /health on addr as E2B's code-interpreter
// server does (200, the JSON string "OK") until ctx is done. A port
// already taken is logged, not fatal: the agent serves on.
func (s *Server) serveCodeHealth(ctx context.Context, addr string) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		s.log.Warn("not serving the code interpreter's health check", "addr", addr, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`"OK"`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Warn("serving the code interpreter's health check", "err", err)
	}
}

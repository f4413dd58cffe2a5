package envd_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process/processconnect"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
)

// agentPath is a kiln-agent built once for the package's tests.
var agentPath string

func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m, &agentPath)) }

const testToken = "0123456789abcdef-test-token"

// env is one real sandbox served by an envd Handler behind the HTTP edge
// and a test router that, like package e2b's, passes every request to
// ServeSandbox.
type env struct {
	t     testing.TB
	m     *sandbox.Manager
	sb    sandbox.Sandbox
	url   string
	token string
	logs  *syncBuffer // the log's warnings and errors, as JSON lines
}

// testRuntime is the runtime of the tests' sandbox: gVisor, the default
// of kiln serve, unless KILN_TEST_RUNTIME says otherwise.
func testRuntime() string {
	if rt := os.Getenv("KILN_TEST_RUNTIME"); rt != "" {
		return rt
	}
	return "runsc"
}

func newEnv(t testing.TB, opts sandbox.CreateOptions) *env {
	t.Helper()
	ocitest.RequireRoot(t)
	cfg := config.FromEnv()
	cfg.AgentPath = agentPath
	_, err := template.Lookup(cfg.DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	rt := testRuntime()
	_, err = exec.LookPath(rt)
	ocitest.Require(t, err == nil, rt+" not installed")
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "kiln.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	logs := &syncBuffer{}
	warn := &slog.HandlerOptions{Level: slog.LevelWarn}
	log := slog.New(slog.NewMultiHandler(slog.NewTextHandler(testWriter{t}, warn), slog.NewJSONHandler(logs, warn)))
	m, err := sandbox.NewManager(context.Background(), sandbox.Config{
		Config: cfg, StateDir: filepath.Join(dir, "sandboxes"), Store: st,
	}, map[string]oci.Runtime{
		"runsc": oci.Runsc(oci.Config{Binary: cfg.RunscPath, Root: filepath.Join(cfg.RunDir, "runsc"), Flags: oci.RunscFlags(context.Background(), cfg.RunscPath, cfg.RunscPlatform)}),
		"runc":  oci.Runc(oci.Config{Binary: cfg.RuncPath, Root: filepath.Join(cfg.RunDir, "runc")}),
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	opts.Runtime = rt
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, opts)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	ed := edge.New(edge.Options{Log: log, Scrub: []string{cfg.DataDir, cfg.RunDir}})
	h := envd.New(envd.Options{Log: log, Edge: ed})
	ts := httptest.NewServer(ed.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := m.Agent(sb.ID)
		if err != nil {
			http.Error(w, `{"code":502,"message":"The sandbox was not found"}`, http.StatusBadGateway)
			return
		}
		h.ServeSandbox(w, r, sb, a, testToken)
	})))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = m.Kill(ctx, sb.ID)
		m.Close()
	})
	return &env{t: t, m: m, sb: sb, url: ts.URL, token: testToken, logs: logs}
}

// sandboxOpts are the tests' sandbox: a global variable, as E2B's
// envVars at create, reaches every process.
func sandboxOpts() sandbox.CreateOptions {
	return sandbox.CreateOptions{Env: map[string]string{"SANDBOX_GLOBAL": "from-create"}}
}

// codecs are the two encodings every RPC test runs with: JSON (what the
// SDKs use) and binary protobuf.
var codecs = []struct {
	name string
	opts []connect.ClientOption
}{
	{"json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"binary", nil},
}

// client is an HTTP client that adds the sandbox's access token and,
// if user is set, selects it with Basic auth as the SDKs do.
func (e *env) client(user string) *http.Client {
	return &http.Client{Transport: headerTransport{token: e.token, user: user}}
}

type headerTransport struct{ token, user string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	if h.user != "" {
		r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(h.user+":")))
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (e *env) process(user string, opts []connect.ClientOption) processconnect.ProcessClient {
	return processconnect.NewProcessClient(e.client(user), e.url, opts...)
}

func (e *env) filesystem(user string, opts []connect.ClientOption) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(e.client(user), e.url, opts...)
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails unless err is a Connect error with code.
func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("error = %v (code %v), want code %v", err, connect.CodeOf(err), code)
	}
}

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

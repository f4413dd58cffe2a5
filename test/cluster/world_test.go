package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/store/postgres"
	"github.com/kiln-sh/kiln/internal/store/postgres/pgtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// Timings of the test cluster: a node missing 8 heartbeats of 1 s is
// lost, so a killed node's sandboxes are reported lost within ~9 s, and
// a node starved of CPU for a few seconds by a loaded CI machine (make
// test runs packages two at a time, beside fuzzing and cold tool builds)
// is not.
const (
	heartbeat = time.Second
	lostAfter = 8
)

// proc is one kiln serve of the cluster.
type proc = servetest.Proc

// world is the cluster: its catalog URL, token and processes.
type world struct {
	t       testing.TB
	kiln    string
	pg      string
	token   string
	mu      sync.Mutex
	procs   []*proc
	catalog *postgres.Store
	key     string // the admin key, once the first front printed it
}

func (w *world) start(name, role string, dataDir string, env ...string) *proc {
	t := w.t
	t.Helper()
	if dataDir == "" {
		dataDir = servetest.DataDir(t)
	}
	p := servetest.StartProc(t, w.kiln, name, dataDir, servetest.FreeAddr(t), append([]string{
		"KILN_ROLE=" + role, "KILN_STORE=" + w.pg, "KILN_CLUSTER_TOKEN=" + w.token,
		"KILN_NODE_NAME=" + name, "KILN_RUNTIME=runc", "KILN_NETWORK=off",
		"KILN_HEARTBEAT_INTERVAL=" + heartbeat.String(), fmt.Sprintf("KILN_NODE_LOST_AFTER=%d", lostAfter)}, env...))
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	return p
}

// ready waits until p answers /healthz (with the token: nodes demand it).
func (w *world) ready(p *proc) {
	w.t.Helper()
	p.Ready(w.t, w.token)
}

// kill9 kills p at once, as a crash would.
func (w *world) kill9(p *proc) {
	w.t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	<-p.Exited
}

// freeze stops p with SIGSTOP and returns once every thread of it is
// stopped: the kernel stops a process only when one of its threads next
// runs, and until the others see the stop they go on answering, for tens
// of milliseconds on a loaded machine.
func (w *world) freeze(p *proc) {
	w.t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		w.t.Fatal(err)
	}
	pid := strconv.Itoa(p.Cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		tasks, err := os.ReadDir("/proc/" + pid + "/task")
		if err != nil {
			w.t.Fatalf("threads of %s: %v", p.Name, err)
		}
		running := 0
		for _, task := range tasks {
			stat, err := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/stat")
			// The state follows the command name, which ends with ") ".
			if i := bytes.LastIndex(stat, []byte(") ")); err == nil && (i < 0 || i+2 >= len(stat) || stat[i+2] != 'T') {
				running++
			}
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: %d of its %d threads not stopped 10 s after SIGSTOP", p.Name, running, len(tasks))
		}
	}
}

// killLeft kills, through each running node directly, the sandboxes the
// catalog says it still runs: a node stopped with SIGTERM leaves its
// sandboxes running for its next start, and there is none.
func (w *world) killLeft(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range w.procs {
		select {
		case <-p.Exited:
			continue
		default:
		}
		recs, _, err := w.catalog.ListSandboxes(ctx, sandbox.Filter{Node: p.Name,
			States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused}, Limit: 1000})
		if err != nil {
			w.t.Errorf("listing %s's sandboxes: %v", p.Name, err)
			continue
		}
		for _, sb := range recs {
			req, _ := http.NewRequestWithContext(ctx, "DELETE", p.URL+"/v1/sandboxes/"+sb.ID.String(), nil)
			req.Header.Set(cluster.TokenHeader, w.token)
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				w.t.Errorf("killing %s on %s: %v", sb.ID, p.Name, err)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				w.t.Errorf("killing %s on %s: status %d", sb.ID, p.Name, resp.StatusCode)
			}
		}
	}
}

// nodeOf is the node the catalog says runs id.
func (w *world) nodeOf(id string) string {
	w.t.Helper()
	sb, err := w.catalog.GetSandbox(context.Background(), sandbox.ID(id))
	if err != nil {
		w.t.Fatalf("catalog record of %s: %v", id, err)
	}
	return sb.Node
}

// waitLive waits until the catalog lists the nodes live.
func (w *world) waitLive(names ...string) {
	w.t.Helper()
	servetest.WaitNodesLive(w.t, w.catalog, 30*time.Second, names...)
}

// newWorld prepares an empty cluster on a fresh catalog database: a kiln
// build, a cluster token, and a cleanup that kills what the catalog says
// still runs and stops every process (printing their warnings if t failed).
func newWorld(t testing.TB) *world {
	t.Helper()
	return newWorldOn(t, "")
}

// newWorldOn is newWorld on the catalog at pg ("": a fresh schema of the
// suite's PostgreSQL).
func newWorldOn(t testing.TB, pg string) *world {
	t.Helper()
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("base template not built (make setup): %v", err))
	tok := make([]byte, 24)
	_, _ = rand.Read(tok)
	if pg == "" {
		pg = pgtest.URL(t)
	}
	w := &world{t: t, kiln: servetest.Build(t), pg: pg, token: hex.EncodeToString(tok)}
	if w.catalog, err = postgres.Open(t.Context(), w.pg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.catalog.Close() })
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.killLeft(w.key)
		for _, p := range w.procs {
			p.Stop(t)
		}
	})
	return w
}

// firstFront starts the cluster's first process, a front, which makes the
// admin key on the empty catalog (w.key); start the others after it.
func (w *world) firstFront(name string, env ...string) *proc {
	w.t.Helper()
	p := w.start(name, config.RoleFront, "", env...)
	w.ready(p)
	select {
	case w.key = <-p.Key:
	case <-time.After(10 * time.Second):
		w.t.Fatalf("%s printed no admin key", name)
	}
	return p
}

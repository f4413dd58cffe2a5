package cluster_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template/builder"
)

// registryCounts counts what a registry serves: manifest and blob
// downloads (GET), and blob uploads.
type registryCounts struct{ manifests, blobs, uploads atomic.Int64 }

func (c *registryCounts) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/"):
			c.manifests.Add(1)
		case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/"):
			c.blobs.Add(1)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/blobs/uploads/"):
			c.uploads.Add(1)
		}
		next.ServeHTTP(w, r)
	})
}

// TestClusterTemplates: a custom template built through a front, on
// whichever node the front sends the build to, is usable on every node.
// A front and three nodes (runc, one slot each) share a real OCI
// registry on loopback as their cluster registry; the build (FROM base,
// a RUN writing a marker, a COPY of files uploaded through the front, an
// ENV) is pushed there with only its own layers, on base's exact build; three concurrent creates land one on
// each node, the two that did not build pull it once, and each sandbox
// has the marker, the env, and base's user and workdir. A node restarted
// still has the build: its next sandbox is made without a pull.
func TestClusterTemplates(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	var counts registryCounts
	srv := httptest.NewServer(counts.wrap(registry.New(registry.Logger(log.New(io.Discard, "", 0)))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://") + "/kiln"

	front := w.firstFront("front")
	names := []string{"node-a", "node-b", "node-c"}
	dirs := map[string]string{}
	procs := map[string]*proc{}
	startNode := func(n string) *proc {
		p := w.start(n, config.RoleNode, dirs[n], "KILN_NODE_SLOTS=1", "KILN_CLUSTER_REGISTRY="+reg)
		procs[n] = p
		return p
	}
	for _, n := range names {
		dirs[n] = servetest.DataDir(t)
		startNode(n)
	}
	for _, n := range names {
		w.ready(procs[n])
	}
	w.waitLive(names...)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	c := client.New(front.URL, w.key)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// A COPY step's files, uploaded through the front as the CLI does
	// (asked for first), then the build: the front sends both to the
	// key's build node.
	tarball, hash := tarOf("data.txt", "copied-7-ok")
	if there, err := c.TemplateFilesExist(ctx, hash); err != nil || there {
		t.Fatalf("files before the upload: %v, %v", there, err)
	}
	if err := c.UploadTemplateFiles(ctx, hash, bytes.NewReader(tarball)); err != nil {
		t.Fatalf("uploading a COPY step's files through the front: %v", err)
	}
	if there, err := c.TemplateFilesExist(ctx, hash); err != nil || !there {
		t.Fatalf("files after the upload, through the front: %v, %v", there, err)
	}
	t0 := time.Now()
	b, err := c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "marked:v1", Spec: api.TemplateSpec{
		From: api.TemplateBase{Template: "base"},
		Steps: []api.TemplateStep{
			{Type: api.StepRun, Args: []string{"echo tmpl-marker-42 >/opt/marker", "root"}},
			{Type: api.StepCopy, Args: []string{"data.txt", "/opt/data.txt"}, FilesHash: hash},
			{Type: api.StepEnv, Args: []string{"TMPL_MARK", "env-ok"}},
		},
	}})
	if err != nil {
		t.Fatalf("starting the build through the front: %v", err)
	}
	if b, err = c.WaitTemplateBuild(ctx, b.ID); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build: %+v, %v", b, err)
	}
	rec, err := w.catalog.GetBuild(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	built := rec.Node
	t.Logf("build %s ready on %s in %v: %s", b.ID, built, time.Since(t0).Round(time.Millisecond), rec.Image)
	if !strings.HasPrefix(rec.Image, reg+"/") || !strings.Contains(rec.Image, ":"+b.ID+"@sha256:") || b.Image != rec.Image {
		t.Errorf("the build's image is %q (API: %q); want %s/…:%s@sha256:…", rec.Image, b.Image, reg, b.ID)
	}
	var pushLine string
	_ = c.TemplateBuildLogs(ctx, b.ID, 0, false, func(e api.TemplateLogEntry) error {
		if strings.Contains(e.Message, "cluster registry") || strings.Contains(e.Message, "pushed") {
			pushLine += "\n  " + e.Message
		}
		return nil
	})
	t.Logf("the build's log on the push:%s", pushLine)
	if !strings.Contains(pushLine, "pushed sha256:") {
		t.Errorf("the build's log says nothing of the push:%s", pushLine)
	}

	t.Run("an E2B template build through the front", func(t *testing.T) { e2bBuild(ctx, t, w, front, reg) })

	// The image in the registry: its own layer only, on base's build.
	ref, err := name.ParseReference(rec.Image)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("the build's image in the registry: %v", err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, k := range rec.Layers {
		if !strings.HasPrefix(k, "builtin:") {
			own++
		}
	}
	if len(m.Layers) != own || own != 2 || !strings.HasPrefix(m.Annotations[builder.AnnotationBuiltin], "base:") ||
		m.Annotations[builder.AnnotationBuild] != b.ID {
		t.Errorf("image: %d layers, annotations %v; want the build's 2 own layers (of %d), on built-in base, build %s",
			len(m.Layers), m.Annotations, len(rec.Layers), b.ID)
	}
	var size int64
	for _, l := range m.Layers {
		size += l.Size
	}
	t.Logf("image: %d layer(s), %d bytes compressed, on %s", len(m.Layers), size, m.Annotations[builder.AnnotationBuiltin])
	pulledBefore := counts.manifests.Load()

	// One sandbox on every node: one slot each, three at once.
	check := func(t *testing.T, id string) {
		t.Helper()
		r, err := c.Output(ctx, id, api.CommandRequest{Cmd: `cat /opt/marker; cat /opt/data.txt; echo; echo "$TMPL_MARK"; whoami; pwd`})
		if err != nil {
			t.Fatalf("command in %s: %v", id, err)
		}
		if want := "tmpl-marker-42\ncopied-7-ok\nenv-ok\nuser\n/home/user\n"; r.Stdout != want || r.Exit.Code != 0 {
			t.Errorf("sandbox %s on %s: stdout %q, stderr %q, exit %d; want %q", id, w.nodeOf(id), r.Stdout, r.Stderr, r.Exit.Code, want)
		}
	}
	t0 = time.Now()
	ids := make([]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "marked:v1", Runtime: "runc", Timeout: 600})
			if err == nil {
				ids[i] = sb.ID
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("creating a sandbox of the template on every node: %v", err)
	}
	t.Logf("3 concurrent creates (2 pulling) in %v", time.Since(t0).Round(time.Millisecond))
	on := map[string]string{}
	for _, id := range ids {
		on[w.nodeOf(id)] = id
		check(t, id)
	}
	if len(on) != 3 {
		t.Fatalf("the sandboxes are on %v, want one on each node", on)
	}
	for _, n := range names {
		fetched := fetchLines(t, procs[n])
		switch {
		case n == built && len(fetched) != 0:
			t.Errorf("%s built the template, yet pulled it: %s", n, fetched)
		case n != built && len(fetched) != 1:
			t.Errorf("%s pulled the template %d times, want once: %s", n, len(fetched), fetched)
		case n != built:
			t.Logf("%s: %s", n, fetched[0])
		}
	}
	if got := counts.manifests.Load() - pulledBefore; got != 2 {
		t.Errorf("the registry served the image's manifest %d times to the nodes, want 2 (the two that did not build it)", got)
	}
	// Nodes report the builds they hold, for placement.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns, err := w.catalog.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders := 0
		for _, n := range ns {
			if n.State == "live" && slices.Contains(n.Builds, b.ID) {
				holders++
			}
		}
		if holders == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d nodes report holding build %s, want 3: %+v", holders, b.ID, ns)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A node that pulled it, restarted, still has it: its next sandbox
	// is made without a pull.
	n := names[0]
	if n == built {
		n = names[1]
	}
	if err := c.KillSandbox(ctx, on[n]); err != nil {
		t.Fatal(err)
	}
	old := procs[n]
	_ = old.Cmd.Process.Signal(syscall.SIGTERM)
	<-old.Exited
	p := startNode(n)
	w.ready(p)
	// Its new URL in the catalog, and past the front's second of caching.
	for deadline := time.Now().Add(20 * time.Second); ; {
		node, err := w.catalog.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(node, func(x cluster.Node) bool { return x.Name == n && x.URL == p.URL }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s restarted: the catalog does not have its new URL", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1100 * time.Millisecond)
	before := counts.manifests.Load()
	t0 = time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "marked:v1", Runtime: "runc", Timeout: 600})
	if err != nil {
		t.Fatalf("create after %s's restart: %v", n, err)
	}
	t.Logf("create on %s after its restart in %v", n, time.Since(t0).Round(time.Millisecond))
	if got := w.nodeOf(sb.ID); got != n {
		t.Errorf("the create went to %s, want %s (the only free slot)", got, n)
	}
	check(t, sb.ID)
	if got := counts.manifests.Load() - before; got != 0 || len(fetchLines(t, p)) != 0 {
		t.Errorf("%s pulled the template again after its restart (%d manifest requests; %s)", n, got, fetchLines(t, p))
	}
	t.Logf("registry: %d manifest and %d blob downloads, %d blob uploads; total %v",
		counts.manifests.Load(), counts.blobs.Load(), counts.uploads.Load(), time.Since(began).Round(time.Millisecond))
}

// fetchLines are p's log lines that say it pulled a template build.
func fetchLines(t *testing.T, p *proc) []string {
	t.Helper()
	b, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte("template build fetched from the cluster registry")) {
			out = append(out, string(l))
		}
	}
	return out
}

// e2bBuild builds a template through front with E2B's template API, as
// its SDKs do: the build request, an upload link (naming the front) and
// the upload through it, the steps, the status polled until ready. The
// front takes them all to one node; the build is pushed to reg.
func e2bBuild(ctx context.Context, t *testing.T, w *world, front *proc, reg string) {
	call := func(method, url string, body any, out any, want int) {
		t.Helper()
		var rd io.Reader
		switch b := body.(type) {
		case nil:
		case []byte:
			rd = bytes.NewReader(b)
		default:
			j, _ := json.Marshal(b)
			rd = bytes.NewReader(j)
		}
		req, _ := http.NewRequestWithContext(ctx, method, url, rd)
		req.Header.Set("X-API-KEY", w.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: status %d, want %d: %s", method, url, resp.StatusCode, want, b)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, url, err, b)
			}
		}
	}
	tarball, hash := tarOf("e2b.txt", "e2b-ok")

	var req struct{ TemplateID, BuildID string }
	call("POST", front.URL+"/v3/templates", map[string]any{"name": "e2btpl"}, &req, http.StatusAccepted)
	var link struct {
		Present bool
		URL     string
	}
	call("GET", front.URL+"/templates/e2btpl/files/"+hash, nil, &link, http.StatusCreated)
	if link.Present || !strings.HasPrefix(link.URL, front.URL+"/templates/e2btpl/files/"+hash+"?") {
		t.Fatalf("upload link %+v: want one on the front (%s)", link, front.URL)
	}
	call("PUT", link.URL, tarball, nil, http.StatusOK)
	call("POST", front.URL+"/v2/templates/e2btpl/builds/"+req.BuildID, map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "COPY", "args": []string{"e2b.txt", "/opt/e2b.txt"}, "filesHash": hash}}}, nil, http.StatusAccepted)
	var st struct {
		Status     string
		LogEntries []struct{ Message string }
		Reason     *struct{ Message string }
	}
	for deadline := time.Now().Add(time.Minute); ; {
		call("GET", front.URL+"/templates/e2btpl/builds/"+req.BuildID+"/status", nil, &st, http.StatusOK)
		if st.Status == "ready" || st.Status == "error" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("E2B build still %s after a minute", st.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rec, err := w.catalog.GetBuild(ctx, req.BuildID)
	if st.Status != "ready" || err != nil || !strings.HasPrefix(rec.Image, reg+"/") {
		t.Fatalf("E2B build: %+v; record %+v, %v", st, rec, err)
	}
	logged := false
	for _, e := range st.LogEntries {
		logged = logged || strings.Contains(e.Message, "pushed sha256:")
	}
	if !logged {
		t.Errorf("the E2B build's status, through the front, has no log of the push: %+v", st.LogEntries)
	}
}

// tarOf is a tar of one file, as a COPY step's upload, and its hash.
func tarOf(name, content string) ([]byte, string) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte(content))
	_ = tw.Close()
	sum := sha256.Sum256(b.Bytes())
	return b.Bytes(), hex.EncodeToString(sum[:])
}

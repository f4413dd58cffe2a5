// Package servetest runs a real kiln serve for tests that drive it from
// outside, as a user would: built from this module, on a free loopback
// port, with its own data dir that shares the machine's built templates,
// and its sandbox networking in a test world of its own (nettest): a host
// namespace with an "internet" behind it, so that no test server touches
// the real host's nftables or links, collides with another, or sends
// traffic off the machine.
package servetest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/network/nettest"
)

// Server is a running kiln serve.
type Server struct {
	URL    string // http://127.0.0.1:<port>
	Key    string // the admin API key it printed on its first start
	Client *client.Client
	// World is the test world its sandbox networking runs in (nettest's
	// standard sites); nil with Options.OwnNetwork.
	World *nettest.World
	// CAFile is, with Options.TLS, the PEM certificate the server serves
	// (self-signed: its own CA), e.g. for NODE_EXTRA_CA_CERTS; HTTP is a
	// client that trusts it (http.DefaultClient without TLS).
	CAFile string
	HTTP   *http.Client
}

// Options change how Start runs kiln serve.
type Options struct {
	// Env is added to kiln serve's environment (after the network's).
	Env []string
	// OwnNetwork: Env sets up the server's sandbox networking itself
	// (e.g. in nettest.RealUplink's namespace, for the one test that must
	// reach a real package mirror), so it gets no test world.
	OwnNetwork bool
	// TLS serves HTTPS only (--tls-cert), with a self-signed certificate
	// for 127.0.0.1, localhost and *.localhost (the sandbox hosts of the
	// default domain): URL is https://, and URLs the SDKs build with
	// https:// for sandbox ports work as they are.
	TLS bool
}

var worlds sync.Map // testing.TB → *nettest.World

// World is t's test world for kiln serve's sandbox networking, made on
// the first call (nettest.NewStandard) and the same for every later call
// in t: servers that t restarts on one data dir keep their sandboxes'
// networks. It is removed when t ends.
func World(t testing.TB) *nettest.World {
	t.Helper()
	if w, ok := worlds.Load(t); ok {
		return w.(*nettest.World)
	}
	w := nettest.NewStandard(t)
	worlds.Store(t, w)
	t.Cleanup(func() { worlds.Delete(t) })
	return w
}

// NetEnv is the environment that puts a kiln serve's sandbox networking in
// t's World.
func NetEnv(t testing.TB) []string {
	t.Helper()
	return World(t).ServeEnv()
}

// Build builds kiln and kiln-agent (static) into one temp dir and returns
// the path of kiln, which finds kiln-agent next to itself.
func Build(t testing.TB) string {
	t.Helper()
	bin := t.TempDir()
	for _, b := range []struct{ out, pkg, cgo string }{
		{"kiln", "github.com/kiln-sh/kiln/cmd/kiln", "1"},
		{"kiln-agent", "github.com/kiln-sh/kiln/cmd/kiln-agent", "0"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", b.out, err, out)
		}
	}
	return filepath.Join(bin, "kiln")
}

// DataDir returns a fresh data dir for a kiln serve whose templates are
// those of KILN_DATA_DIR (make setup's).
func DataDir(t testing.TB) string {
	t.Helper()
	dataDir := t.TempDir()
	shared := filepath.Join(config.FromEnv().DataDir, "templates")
	if err := os.Symlink(shared, filepath.Join(dataDir, "templates")); err != nil {
		t.Fatal(err)
	}
	return dataDir
}

// FreeAddr returns a loopback address with a port free at the time.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

var keyRE = regexp.MustCompile(`export KILN_API_KEY=(e2b_[0-9a-f]{40})`)

// Start starts `kiln serve` from the kiln binary on a free loopback port
// with a fresh data dir whose templates are those of KILN_DATA_DIR and its
// sandbox networking in t's World, and returns once it answers and has
// printed its admin key. Cleanup kills the sandboxes still alive (they
// would outlive the server), stops it, and logs its warnings and errors
// if the test failed.
func Start(t testing.TB, kiln string) *Server { return StartWith(t, kiln, Options{}) }

// StartWith is Start with options.
func StartWith(t testing.TB, kiln string, o Options) *Server {
	t.Helper()
	s := &Server{HTTP: http.DefaultClient}
	var env []string
	if !o.OwnNetwork {
		s.World = World(t)
		env = s.World.ServeEnv()
	}
	if o.TLS {
		var keyFile string
		var pool *x509.CertPool
		s.CAFile, keyFile, pool = SelfSigned(t, t.TempDir(), "localhost", "*.localhost")
		env = append(env, "KILN_TLS_CERT="+s.CAFile, "KILN_TLS_KEY="+keyFile)
		s.HTTP = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	p := StartProc(t, kiln, "kiln serve", DataDir(t), FreeAddr(t), append(env, o.Env...))
	if o.TLS {
		p.URL = "https://" + strings.TrimPrefix(p.URL, "http://")
		p.hc = s.HTTP
	}
	s.URL = p.URL
	t.Cleanup(func() {
		s.killAlive(t)
		p.Stop(t)
	})
	p.Ready(t, "")
	s.Key = p.AdminKey(t)
	s.Client = client.New(s.URL, s.Key, client.WithHTTPClient(s.HTTP))
	return s
}

// SelfSigned writes a self-signed certificate for names and 127.0.0.1
// and its key into dir, and returns their paths and a pool that trusts
// it.
func SelfSigned(t testing.TB, dir string, names ...string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: names, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// killAlive kills the sandboxes still alive: they would outlive the
// server.
func (s *Server) killAlive(t testing.TB) {
	if s.Client == nil {
		return
	}
	for _, id := range s.Alive(t) {
		if err := s.Client.KillSandbox(context.Background(), id); err != nil {
			t.Errorf("killing %s: %v", id, err)
		}
	}
}

// Proc is one running kiln serve.
type Proc struct {
	Name, URL string
	Cmd       *exec.Cmd
	Log       string        // its stderr, the server's log
	Exited    chan struct{} // closed once it exited
	Key       chan string   // the admin key, if it printed one
	hc        *http.Client  // nil: http.DefaultClient
	logf      *os.File
}

// StartProc starts kiln serve on addr with dataDir and env added to this
// process's environment; name names it in failures.
func StartProc(t testing.TB, kiln, name, dataDir, addr string, env []string) *Proc {
	t.Helper()
	p := StartArgs(t, kiln, name, env, "--listen", addr, "--data-dir", dataDir)
	p.URL = "http://" + addr
	return p
}

// StartArgs starts kiln serve with args and env added to this process's
// environment; name names it in failures. Its URL is the caller's to set.
func StartArgs(t testing.TB, kiln, name string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Log: filepath.Join(t.TempDir(), "serve.log"),
		Exited: make(chan struct{}), Key: make(chan string, 1)}
	p.Cmd = exec.Command(kiln, append([]string{"serve"}, args...)...)
	p.Cmd.Env = append(os.Environ(), env...)
	stdout, err := p.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.logf, err = os.Create(p.Log); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Stderr = p.logf
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := keyRE.FindStringSubmatch(sc.Text()); m != nil {
				p.Key <- m[1]
			}
		}
		_ = p.Cmd.Wait()
		close(p.Exited)
	}()
	return p
}

// Ready waits until p answers /healthz (with token, if a cluster node's).
func (p *Proc) Ready(t testing.TB, token string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest("GET", p.URL+"/healthz", nil)
		if token != "" {
			req.Header.Set(cluster.TokenHeader, token)
		}
		hc := p.hc
		if hc == nil {
			hc = http.DefaultClient
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.Exited:
			logs, _ := os.ReadFile(p.Log)
			t.Fatalf("%s exited:\n%s", p.Name, logs)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(p.Log)
			t.Fatalf("%s did not come up: %v\n%s", p.Name, err, logs)
		}
	}
}

// AdminKey is the admin key p printed on its first start.
func (p *Proc) AdminKey(t testing.TB) string {
	t.Helper()
	select {
	case k := <-p.Key:
		return k
	case <-time.After(60 * time.Second):
		t.Fatalf("%s printed no admin key", p.Name)
		return ""
	}
}

// Stop stops p (SIGTERM, then SIGKILL after 20 s) and logs its warnings
// and errors if t failed.
func (p *Proc) Stop(t testing.TB) {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Exited:
	case <-time.After(20 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.Exited
	}
	p.logf.Close()
	if t.Failed() {
		logs, _ := os.ReadFile(p.Log)
		t.Logf("%s log (warnings and errors):\n%s", p.Name, GrepErrors(logs))
	}
}

// Alive lists the ids of the server's sandboxes that are not stopped or
// failed; the server has its own data dir, so they are all the test's.
func (s *Server) Alive(t testing.TB) []string {
	t.Helper()
	var ids []string
	f := client.ListFilter{States: []string{"creating", "running", "paused"}}
	for sb, err := range s.Client.AllSandboxes(context.Background(), f) {
		if err != nil {
			t.Errorf("listing sandboxes: %v", err)
			break
		}
		ids = append(ids, sb.ID)
	}
	return ids
}

// GrepErrors keeps the warning and error lines of kiln serve's JSON log.
func GrepErrors(logs []byte) string {
	var out []string
	for _, l := range strings.Split(string(logs), "\n") {
		if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// WaitNodesLive waits up to within until the cluster catalog lists every
// one of names live, and fails t if it does not.
func WaitNodesLive(t testing.TB, catalog interface {
	Nodes(context.Context) ([]cluster.Node, error)
}, within time.Duration, names ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ns, err := catalog.Nodes(context.Background())
		live := map[string]bool{}
		for _, n := range ns {
			live[n.Name] = n.State == cluster.NodeLive
		}
		all := err == nil
		for _, n := range names {
			all = all && live[n]
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes %v not all live in the catalog: %+v, %v", names, ns, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

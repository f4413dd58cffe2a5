package helm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/servetest"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

const (
	kubeDir      = "/usr/local/lib/kiln"
	etcdBin      = kubeDir + "/etcd"
	apiserverBin = kubeDir + "/kube-apiserver"
)

// controlPlane is a real etcd and kube-apiserver on loopback: no kubelet,
// scheduler or controllers, so objects are stored and validated but no pod
// is ever made or run.
type controlPlane struct {
	kubeconfig string // for helm
	dyn        dynamic.Interface
	disc       discovery.DiscoveryInterface
	mapper     meta.RESTMapper
}

// startControlPlane builds etcd and kube-apiserver if needed
// (scripts/install-kube.sh, a no-op once built), starts them on free
// loopback ports in a temporary dir, and waits for the API server's
// /readyz. Both are killed at the test's end.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	if err := install(t, "install-kube.sh"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no etcd and kube-apiserver: %v", err)
		}
		t.Fatalf("installing etcd and kube-apiserver: %v", err)
	}

	dir := t.TempDir()
	clientPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	start := time.Now()
	run(t, dir, "etcd", etcdBin,
		"--name=kiln-test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kiln-test="+peerURL, "--log-level=warn",
		// A throwaway store: no fsync.
		"--unsafe-no-fsync")
	waitOK(t, dir, "etcd", http.DefaultClient, etcdURL+"/health", nil)
	t.Logf("etcd ready in %v", time.Since(start).Round(time.Millisecond))

	// The API server's serving certificate, self-signed; the admin's
	// token (in the system:masters group, which RBAC lets do anything);
	// the service-account signing key.
	certFile, keyFile, caPool := servetest.SelfSigned(t, dir, "localhost")
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	saKey := keyPEMOf(t, newKey(t))
	token := rand.Text()
	files := map[string][]byte{
		"sa.key":     saKey,
		"tokens.csv": []byte(token + ",kiln-test-admin,kiln-test-admin,system:masters\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	url := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	start = time.Now()
	run(t, dir, "kube-apiserver", apiserverBin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile,
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"), "--authorization-mode=RBAC", "--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		// Only allocated from, never routed: no pod or proxy runs.
		"--service-cluster-ip-range=10.96.0.0/24",
		// The node DaemonSet's pods are privileged.
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false", "--profiling=false")
	tlsConf := &tls.Config{RootCAs: caPool}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: 5 * time.Second}
	waitOK(t, dir, "kube-apiserver", client, url+"/readyz", http.Header{"Authorization": {"Bearer " + token}})
	t.Logf("kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, url, certFile, token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM}}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cp := &controlPlane{kubeconfig: kubeconfig, dyn: dyn, disc: disc}
	cp.refreshMapper(t)
	return cp
}

// refreshMapper rereads the API server's resources (after a CRD).
func (cp *controlPlane) refreshMapper(t *testing.T) {
	t.Helper()
	groups, err := restmapper.GetAPIGroupResources(cp.disc)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	cp.mapper = restmapper.NewDiscoveryRESTMapper(groups)
}

// resource is the client for u's kind, in namespace ns if namespaced.
func (cp *controlPlane) resource(u *unstructured.Unstructured, ns string) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := cp.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return cp.dyn.Resource(m.Resource).Namespace(ns), nil
	}
	return cp.dyn.Resource(m.Resource), nil
}

// run starts a process whose output goes to dir/name.log, killed (and
// waited for) at the test's end.
func run(t *testing.T, dir, name, bin string, args ...string) {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
}

// waitOK polls url until it answers 200, failing with the tail of
// name's log after two minutes or when the process has exited.
func waitOK(t *testing.T, dir, name string, client *http.Client, url string, h http.Header) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h
		resp, err := client.Do(req)
		if err == nil {
			body := new(bytes.Buffer)
			body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	logText, _ := os.ReadFile(filepath.Join(dir, name+".log"))
	if len(logText) > 4000 {
		logText = logText[len(logText)-4000:]
	}
	t.Fatalf("%s not ready at %s: %s\n%s", name, url, last, logText)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyPEMOf(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

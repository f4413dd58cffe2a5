// Package helm_test checks the Helm chart in deploy/helm/kiln with a real
// Helm (built from the Go module proxy by scripts/install-helm.sh, which
// the tests call themselves: a no-op once built) and, in TestServer, a real
// etcd and kube-apiserver on loopback (scripts/install-kube.sh).
//
// Offline: `helm lint --strict`, then `helm template` with several sets of
// values, whose manifests are checked field by field (privileged nodes on
// host paths, the token and the catalog wired from Secrets, the wildcard
// ingress host of E2B's port URLs, the bundled PostgreSQL, the drain) and
// decoded strictly into their k8s.io/api types (unknown fields, duplicate
// fields and values of the wrong type refused); values that must be refused.
//
// Against the API server: every rendered object of every set passes a
// server-side dry-run (what `kubectl apply --dry-run=server` sends: a
// create with dryRun=All and strict field validation, so the API server's
// own validation and admission run); values the chart renders but that
// make invalid objects are refused; then a real `helm install`, `helm
// upgrade` (the generated token kept) and `helm uninstall`. No pod runs:
// there is no kubelet or scheduler (docs/kubernetes.md says why, and how to
// run the chart on a real cluster).
package helm_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

const helmBin = "/usr/local/lib/kiln/helm"

// repo is the repository's root.
func repo(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// install runs scripts/<script>, which builds a tool once and then
// returns at once, and logs how long it took.
func install(t *testing.T, script string) error {
	t.Helper()
	start := time.Now()
	if out, err := exec.Command(filepath.Join(repo(t), "scripts", script)).CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/%s: %w\n%s", script, err, out)
	}
	t.Logf("scripts/%s took %v", script, time.Since(start).Round(time.Millisecond))
	return nil
}

// chart is the chart's path, Helm installed.
func chart(t *testing.T) string {
	t.Helper()
	if err := install(t, "install-helm.sh"); err != nil {
		t.Fatalf("installing Helm: %v", err)
	}
	return filepath.Join(repo(t), "deploy", "helm", "kiln")
}

// obj is one decoded manifest.
type obj map[string]any

// at walks keys (map keys, or list indices as ints) and returns what is
// there, nil if nothing.
func (o obj) at(path ...any) any {
	var v any = map[string]any(o)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// rendered is helm template's output: the manifests by "Kind/name",
// decoded for the field checks, and each one's YAML document.
type rendered struct {
	objs map[string]obj
	docs [][]byte
}

// render runs helm template with values.
func render(t *testing.T, chartDir string, set ...string) (rendered, error) {
	t.Helper()
	args := []string{"template", "r", chartDir, "--namespace", "kiln"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helmBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return rendered{}, fmt.Errorf("%w: %s", err, stderr.String())
	}
	r := rendered{objs: map[string]obj{}}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return r, nil
		} else if err != nil {
			t.Fatalf("splitting helm template's output: %v\n%s", err, out)
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("decoding helm template's output: %v\n%s", err, doc)
		}
		if o == nil {
			continue
		}
		r.objs[fmt.Sprintf("%s/%s", obj(o).at("kind"), obj(o).at("metadata", "name"))] = o
		r.docs = append(r.docs, doc)
	}
}

// strict decodes manifests into their k8s.io/api types (client-go's
// scheme), refusing unknown and duplicate fields: offline schema checking.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// checkTyped decodes each document strictly and returns the first error.
// Kinds outside Kubernetes' own API (the ServiceMonitor) are not known
// offline: TestServer checks them against their CRD's schema.
func checkTyped(docs [][]byte) (typed int, err error) {
	for _, doc := range docs {
		_, gvk, err := strict.Decode(doc, nil, nil)
		if runtime.IsNotRegisteredError(err) {
			continue
		}
		if err != nil {
			return typed, fmt.Errorf("%v: %w", gvk, err)
		}
		typed++
	}
	return typed, nil
}

// envOf is container 0's environment of a pod template: values, or
// "secret:NAME/KEY", or "field:PATH".
func envOf(o obj) map[string]string {
	env := map[string]string{}
	list, _ := o.at("spec", "template", "spec", "containers", 0, "env").([]any)
	for _, e := range list {
		e := obj(e.(map[string]any))
		name, _ := e.at("name").(string)
		switch {
		case e.at("valueFrom", "secretKeyRef") != nil:
			env[name] = fmt.Sprintf("secret:%s/%s", e.at("valueFrom", "secretKeyRef", "name"), e.at("valueFrom", "secretKeyRef", "key"))
		case e.at("valueFrom", "fieldRef") != nil:
			env[name] = fmt.Sprintf("field:%s", e.at("valueFrom", "fieldRef", "fieldPath"))
		default:
			env[name] = fmt.Sprint(e.at("value"))
		}
	}
	return env
}

// secretData is a Secret's data, decoded.
func secretData(t *testing.T, o obj) map[string]string {
	t.Helper()
	data := map[string]string{}
	m, _ := o.at("data").(map[string]any)
	for k, v := range m {
		b, err := base64.StdEncoding.DecodeString(v.(string))
		if err != nil {
			t.Fatalf("secret key %s: %v", k, err)
		}
		data[k] = string(b)
	}
	return data
}

func TestLint(t *testing.T) {
	dir := chart(t)
	for _, set := range [][]string{
		{"catalog.url=postgres://kiln@db/kiln"},
		{"postgresql.enabled=true", "domain=sb.example.com", "ingress.enabled=true", "ingress.host=kiln.example.com"},
	} {
		args := []string{"lint", "--strict", dir}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, err := exec.Command(helmBin, args...).CombinedOutput(); err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}
}

// valueSet is one set of values and what its manifests must hold.
type valueSet struct {
	name  string
	set   []string
	check func(t *testing.T, objs map[string]obj)
}

const token = "0123456789abcdef0123456789abcdef-token"

// valueSets are rendered and checked offline by TestTemplate and
// dry-run against the API server by TestServer.
var valueSets = []valueSet{{
	name: "external catalog and token in the chart's Secret",
	set:  []string{"catalog.url=postgres://kiln:pw@db.internal/kiln", "clusterToken.value=" + token},
	check: func(t *testing.T, objs map[string]obj) {
		sec := secretData(t, objs["Secret/r-kiln-secrets"])
		if sec["url"] != "postgres://kiln:pw@db.internal/kiln" || sec["token"] != token {
			t.Errorf("the chart's Secret holds %v", sec)
		}
		for _, k := range []string{"DaemonSet/r-kiln-node", "Deployment/r-kiln-front"} {
			env := envOf(objs[k])
			if env["KILN_STORE"] != "secret:r-kiln-secrets/url" || env["KILN_CLUSTER_TOKEN"] != "secret:r-kiln-secrets/token" {
				t.Errorf("%s: store %q, token %q; want them from the chart's Secret", k, env["KILN_STORE"], env["KILN_CLUSTER_TOKEN"])
			}
		}
		for _, k := range []string{"Ingress/r-kiln", "StatefulSet/r-kiln-postgresql", "ServiceMonitor/r-kiln"} {
			if objs[k] != nil {
				t.Errorf("%s rendered, but not asked for", k)
			}
		}
		if objs["PodDisruptionBudget/r-kiln-front"].at("spec", "minAvailable") != 1 {
			t.Errorf("the fronts' PodDisruptionBudget: %v", objs["PodDisruptionBudget/r-kiln-front"])
		}
	},
}, {
	name: "the node DaemonSet",
	set:  []string{"catalog.url=postgres://db/kiln"},
	check: func(t *testing.T, objs map[string]obj) {
		ds := objs["DaemonSet/r-kiln-node"]
		pod := obj(ds.at("spec", "template", "spec").(map[string]any))
		if pod.at("containers", 0, "securityContext", "privileged") != true || pod.at("hostNetwork") != true || pod.at("hostPID") != true {
			t.Errorf("node pod: privileged %v, hostNetwork %v, hostPID %v; want all true", pod.at("containers", 0, "securityContext", "privileged"),
				pod.at("hostNetwork"), pod.at("hostPID"))
		}
		hostPaths := map[string]string{}
		vols, _ := pod.at("volumes").([]any)
		for _, v := range vols {
			v := obj(v.(map[string]any))
			if p, ok := v.at("hostPath", "path").(string); ok {
				hostPaths[v.at("name").(string)] = p
			}
		}
		mounts := map[string]string{}
		ms, _ := pod.at("containers", 0, "volumeMounts").([]any)
		for _, m := range ms {
			m := obj(m.(map[string]any))
			mounts[m.at("name").(string)] = fmt.Sprint(m.at("mountPath"), " ", m.at("mountPropagation"))
		}
		env := envOf(ds)
		for vol, path := range map[string]string{"data": "/var/lib/kiln", "run": "/run/kiln"} {
			if hostPaths[vol] != path || mounts[vol] != path+" Bidirectional" {
				t.Errorf("volume %s: host path %q mounted %q; want %s, Bidirectional", vol, hostPaths[vol], mounts[vol], path)
			}
		}
		for k, want := range map[string]string{
			"KILN_ROLE": "node", "KILN_NODE_NAME": "field:spec.nodeName", "KILN_DATA_DIR": "/var/lib/kiln",
			"KILN_RUN_DIR": "/run/kiln", "KILN_ADVERTISE_URL": "http://$(POD_IP):8421", "KILN_LISTEN": "0.0.0.0:8421",
		} {
			if env[k] != want {
				t.Errorf("node env %s = %q, want %q", k, env[k], want)
			}
		}
		if pod.at("nodeSelector", "kiln.dev/sandbox-host") != "true" || pod.at("tolerations", 0, "key") != "kiln.dev/sandbox-host" {
			t.Errorf("node pod's selector %v and tolerations %v: want sandbox hosts only", pod.at("nodeSelector"), pod.at("tolerations"))
		}
		// The drain (30 s), then kiln's shutdown grace (10 s), and 5 s.
		if env["KILN_DRAIN_TIMEOUT"] != "30s" || pod.at("terminationGracePeriodSeconds") != 45 {
			t.Errorf("node pod: drain timeout %q, grace %v; want 30s, 45", env["KILN_DRAIN_TIMEOUT"], pod.at("terminationGracePeriodSeconds"))
		}
		if pod.at("containers", 0, "resources", "requests", "memory") != "512Mi" {
			t.Errorf("node pod: requests %v", pod.at("containers", 0, "resources", "requests"))
		}
		if env := envOf(objs["Deployment/r-kiln-front"]); env["KILN_ROLE"] != "front" {
			t.Errorf("front role %q", env["KILN_ROLE"])
		}
		front := objs["Deployment/r-kiln-front"]
		if front.at("spec", "template", "metadata", "annotations", "prometheus.io/scrape") != "true" {
			t.Errorf("front pods lack Prometheus annotations: %v", front.at("spec", "template", "metadata", "annotations"))
		}
		if front.at("spec", "template", "spec", "containers", 0, "securityContext", "privileged") != nil {
			t.Errorf("fronts are privileged")
		}
	},
}, {
	name:  "drain timeout",
	set:   []string{"catalog.url=postgres://db/kiln", "node.drainTimeout=2m30s"},
	check: drains("2m30s", 165),
}, {
	name:  "drain timeout and grace period",
	set:   []string{"catalog.url=postgres://db/kiln", "node.drainTimeout=500ms", "node.terminationGracePeriodSeconds=5"},
	check: drains("500ms", 5),
}, {
	name:  "no drain",
	set:   []string{"catalog.url=postgres://db/kiln", "node.drainTimeout=0"},
	check: drains("0", 15),
}, {
	name: "existing Secrets",
	set:  []string{"catalog.existingSecret=my-db", "clusterToken.existingSecret=my-token"},
	check: func(t *testing.T, objs map[string]obj) {
		if objs["Secret/r-kiln-secrets"] != nil {
			t.Errorf("the chart made a Secret though both are given")
		}
		env := envOf(objs["DaemonSet/r-kiln-node"])
		if env["KILN_STORE"] != "secret:my-db/url" || env["KILN_CLUSTER_TOKEN"] != "secret:my-token/token" {
			t.Errorf("node: store %q, token %q; want the given Secrets", env["KILN_STORE"], env["KILN_CLUSTER_TOKEN"])
		}
	},
}, {
	name: "bundled PostgreSQL, wildcard ingress and ServiceMonitor",
	set: []string{"postgresql.enabled=true", "domain=sb.example.com", "ingress.enabled=true", "ingress.host=kiln.example.com",
		"ingress.tlsSecretName=kiln-tls", "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.apiKeySecret.name=prom-key"},
	check: func(t *testing.T, objs map[string]obj) {
		sec := secretData(t, objs["Secret/r-kiln-secrets"])
		pw := sec["postgres-password"]
		if len(pw) < 16 || sec["url"] != "postgres://kiln:"+pw+"@r-kiln-postgresql:5432/kiln?sslmode=disable" || len(sec["token"]) < 32 {
			t.Errorf("the chart's Secret for a bundled PostgreSQL: %v", sec)
		}
		if env := envOf(objs["StatefulSet/r-kiln-postgresql"]); env["POSTGRES_PASSWORD"] != "secret:r-kiln-secrets/postgres-password" {
			t.Errorf("PostgreSQL's password from %q", env["POSTGRES_PASSWORD"])
		}
		if objs["Service/r-kiln-postgresql"] == nil {
			t.Errorf("no PostgreSQL Service")
		}
		if env := envOf(objs["DaemonSet/r-kiln-node"]); env["KILN_DOMAIN"] != "sb.example.com" || env["KILN_STORE"] != "secret:r-kiln-secrets/url" {
			t.Errorf("node: domain %q, store %q", env["KILN_DOMAIN"], env["KILN_STORE"])
		}
		ing := objs["Ingress/r-kiln"]
		var hosts []string
		rules, _ := ing.at("spec", "rules").([]any)
		for i := range rules {
			hosts = append(hosts, fmt.Sprint(ing.at("spec", "rules", i, "host")))
			if svc := ing.at("spec", "rules", i, "http", "paths", 0, "backend", "service", "name"); svc != "r-kiln" {
				t.Errorf("ingress rule %d goes to %v, want the fronts' Service", i, svc)
			}
		}
		if !slices.Equal(hosts, []string{"kiln.example.com", "*.sb.example.com"}) {
			t.Errorf("ingress hosts %v, want the API's and the wildcard sandbox host", hosts)
		}
		if tls := fmt.Sprint(ing.at("spec", "tls", 0, "hosts")); tls != "[kiln.example.com *.sb.example.com]" {
			t.Errorf("ingress TLS hosts %s", tls)
		}
		sm := objs["ServiceMonitor/r-kiln"]
		if sm.at("spec", "endpoints", 0, "authorization", "credentials", "name") != "prom-key" || sm.at("spec", "endpoints", 0, "path") != "/metrics" {
			t.Errorf("ServiceMonitor: %v", sm.at("spec"))
		}
	},
}}

// drains checks the node pod's drain timeout and grace period.
func drains(timeout string, grace int) func(t *testing.T, objs map[string]obj) {
	return func(t *testing.T, objs map[string]obj) {
		ds := objs["DaemonSet/r-kiln-node"]
		if env := envOf(ds); env["KILN_DRAIN_TIMEOUT"] != timeout || ds.at("spec", "template", "spec", "terminationGracePeriodSeconds") != grace {
			t.Errorf("node pod: drain timeout %q, grace %v; want %s, %d", env["KILN_DRAIN_TIMEOUT"],
				ds.at("spec", "template", "spec", "terminationGracePeriodSeconds"), timeout, grace)
		}
	}
}

// refusedValues are values the chart refuses, with a message that says
// what to set.
var refusedValues = []struct {
	set  []string
	want string
}{
	{nil, "set catalog.url or catalog.existingSecret"},
	{[]string{"catalog.url=postgres://db/kiln", "clusterToken.value=short"}, "at least 32 characters"},
	{[]string{"catalog.url=postgres://db/kiln", "ingress.enabled=true"}, "needs ingress.host"},
	{[]string{"catalog.url=postgres://db/kiln", "metrics.serviceMonitor.enabled=true"}, "wants an API key"},
	{[]string{"catalog.url=postgres://db/kiln", "node.drainTimeout=soon"}, `node.drainTimeout "soon" is not a duration`},
	{[]string{"catalog.url=postgres://db/kiln", "node.drainTimeout=2m", "node.terminationGracePeriodSeconds=120"},
		"must be longer than node.drainTimeout (2m, 120 s)"},
}

// invalidValues are values the chart renders but that make invalid
// objects: the API server refuses them with an error saying server, and
// the offline typed decoding, where offline is set, with one saying that.
var invalidValues = []struct {
	name            string
	set             []string
	offline, server string
}{
	{"unknown field", []string{"node.extraEnv[0].nam=X"}, `unknown field "spec.template.spec.containers[0].env[`, `unknown field "spec.template.spec.containers[0].env[`},
	{"wrong type", []string{"front.replicas=two"}, "cannot unmarshal", "cannot unmarshal"},
	{"bad quantity", []string{"node.resources.requests.cpu=lots"}, "quantities must match", "quantities must match"},
	{"port out of range", []string{"node.port=70000"}, "", "must be between 1 and 65535"},
	{"bad ingress host", []string{"ingress.enabled=true", "ingress.host=Kiln_Example"}, "", "a lowercase RFC 1123 subdomain"},
	{"ServiceMonitor interval", []string{"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.apiKeySecret.name=k",
		"metrics.serviceMonitor.interval=soon"}, "", "spec.endpoints[0].interval"},
}

func TestTemplate(t *testing.T) {
	dir := chart(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			r, err := render(t, dir, vs.set...)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			vs.check(t, r.objs)
			typed, err := checkTyped(r.docs)
			if err != nil {
				t.Errorf("offline schema check: %v", err)
			}
			t.Logf("%d objects, %d of them checked against their k8s.io/api types", len(r.docs), typed)
		})
	}
	for _, tc := range refusedValues {
		if _, err := render(t, dir, tc.set...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v; want an error saying %q", tc.set, err, tc.want)
		}
	}
	for _, tc := range invalidValues {
		if tc.offline == "" {
			continue
		}
		r, err := render(t, dir, append([]string{"catalog.url=postgres://db/kiln"}, tc.set...)...)
		if err != nil {
			t.Errorf("%s: helm template: %v", tc.name, err)
			continue
		}
		if _, err := checkTyped(r.docs); err == nil || !strings.Contains(err.Error(), tc.offline) {
			t.Errorf("%s: offline schema check: %v; want an error saying %q", tc.name, err, tc.offline)
		}
	}
}

// Package helm_test checks the Helm chart in deploy/helm/kiln with a real
// Helm (built from the Go module proxy by scripts/install-helm.sh, which
// the test calls itself: a no-op once built): `helm lint --strict`, then
// `helm template` with several sets of values, whose manifests are decoded
// and checked field by field (privileged nodes on host paths, the token
// and the catalog wired from Secrets, the wildcard ingress host of E2B's
// port URLs, the bundled PostgreSQL), and values that must be refused.
package helm_test

import (
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
)

const helmBin = "/usr/local/lib/kiln/helm"

// chart is the chart's path, Helm installed.
func chart(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if out, err := exec.Command(filepath.Join(repo, "scripts", "install-helm.sh")).CombinedOutput(); err != nil {
		t.Fatalf("installing Helm: %v\n%s", err, out)
	}
	t.Logf("scripts/install-helm.sh took %v", time.Since(start).Round(time.Millisecond))
	return filepath.Join(repo, "deploy", "helm", "kiln")
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

// render runs helm template with values and returns the manifests by
// "Kind/name".
func render(t *testing.T, chartDir string, set ...string) (map[string]obj, error) {
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
		return nil, fmt.Errorf("%w: %s", err, stderr.String())
	}
	objs := map[string]obj{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			t.Fatalf("decoding helm template's output: %v\n%s", err, out)
		}
		if o == nil {
			continue
		}
		objs[fmt.Sprintf("%s/%s", obj(o).at("kind"), obj(o).at("metadata", "name"))] = o
	}
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

func TestTemplate(t *testing.T) {
	dir := chart(t)
	const token = "0123456789abcdef0123456789abcdef-token"
	for _, tc := range []struct {
		name  string
		set   []string
		check func(t *testing.T, objs map[string]obj)
	}{{
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
			if pod.at("terminationGracePeriodSeconds") != 30 || pod.at("containers", 0, "resources", "requests", "memory") != "512Mi" {
				t.Errorf("node pod: grace %v, requests %v", pod.at("terminationGracePeriodSeconds"), pod.at("containers", 0, "resources", "requests"))
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
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := render(t, dir, tc.set...)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			tc.check(t, objs)
		})
	}

	// Values the chart refuses, with a message that says what to set.
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "set catalog.url or catalog.existingSecret"},
		{[]string{"catalog.url=postgres://db/kiln", "clusterToken.value=short"}, "at least 32 characters"},
		{[]string{"catalog.url=postgres://db/kiln", "ingress.enabled=true"}, "needs ingress.host"},
		{[]string{"catalog.url=postgres://db/kiln", "metrics.serviceMonitor.enabled=true"}, "wants an API key"},
	} {
		if _, err := render(t, dir, tc.set...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v; want an error saying %q", tc.set, err, tc.want)
		}
	}
}

package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-sh/kiln/internal/metrics"
)

// exported returns every metric family Kiln's registry describes (with all
// the collectors kiln serve registers) and its labels.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	m := metrics.New(fakeSource{})
	m.RegisterImages(poolSource{})
	m.RegisterNetwork(nil) // Describe does not read the source
	ch := make(chan *prometheus.Desc)
	go func() { m.Registry().Describe(ch); close(ch) }()
	name := regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		n := name.FindStringSubmatch(s)
		if n == nil {
			t.Fatalf("cannot read a metric name from %s", s)
		}
		var ls []string
		if l := labels.FindStringSubmatch(s); l != nil && l[1] != "" {
			for _, x := range strings.Split(l[1], ",") {
				ls = append(ls, strings.TrimSuffix(strings.TrimPrefix(x, "c("), ")"))
			}
		}
		out[n[1]] = ls
	}
	if len(out) < 10 {
		t.Fatalf("the registry describes only %d metrics", len(out))
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{([^{}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][\w:]*(\s*\()?`)
	promFuncs    = []string{"sum", "avg", "min", "max", "count", "topk", "bottomk", "rate", "irate", "increase",
		"histogram_quantile", "label_values", "clamp_min", "clamp_max", "abs", "delta", "deriv"}
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
	// Labels Prometheus adds to every series it scrapes.
	scrapeLabels = []string{"instance", "job"}
)

// metricsOf returns the metric names an expression selects and the label
// names it matches or groups by; unknown identifiers are errors.
func metricsOf(expr string) (names, labels []string, bad []string) {
	e := promStrings.ReplaceAllString(expr, `""`)
	for _, m := range promMatchers.FindAllStringSubmatch(e, -1) {
		for _, l := range promMatcher.FindAllStringSubmatch(m[1], -1) {
			labels = append(labels, l[1])
		}
	}
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	for _, g := range promGrouping.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	e = promGrouping.ReplaceAllString(e, " ")
	for _, id := range promIdent.FindAllStringSubmatch(e, -1) {
		word := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(id[0]), "("))
		switch {
		case id[1] != "":
			if !slices.Contains(promFuncs, word) {
				bad = append(bad, "function "+word)
			}
		case slices.Contains(promKeywords, word):
		default:
			names = append(names, word)
		}
	}
	return names, labels, bad
}

var labelValues = regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)

// checkQuery returns what is wrong with a dashboard query against the
// exported families (name -> labels), marking the families it uses.
func checkQuery(families map[string][]string, expr string, used map[string]bool) []string {
	var problems []string
	if m := labelValues.FindStringSubmatch(expr); m != nil { // a variable's query
		if _, ok := families[m[1]]; !ok {
			return []string{"Kiln exports no metric " + m[1]}
		}
		if !slices.Contains(append(slices.Clone(scrapeLabels), families[m[1]]...), m[2]) {
			problems = append(problems, m[1]+" has no label "+m[2])
		}
		return problems
	}
	names, labels, bad := metricsOf(expr)
	for _, x := range bad {
		problems = append(problems, "unknown "+x)
	}
	if len(names) == 0 {
		problems = append(problems, "names no metric")
	}
	have := slices.Clone(scrapeLabels)
	for _, n := range names {
		family, ok := n, false
		if _, ok = families[n]; !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base, cut := strings.CutSuffix(n, suffix)
				if _, known := families[base]; cut && known {
					family, ok = base, true
					if suffix == "_bucket" {
						have = append(have, "le")
					}
					break
				}
			}
		}
		if !ok {
			problems = append(problems, "Kiln exports no metric "+n)
			continue
		}
		used[family] = true
		have = append(have, families[family]...)
	}
	for _, l := range labels {
		if !slices.Contains(have, l) {
			problems = append(problems, "no metric it names has the label "+l)
		}
	}
	return problems
}

// TestGrafanaDashboard: every query of docs/grafana/kiln.json names only
// metrics Kiln's registry exports (a histogram's _bucket, _sum and _count
// series included) and only labels those metrics have, so a renamed or
// dropped metric breaks this test rather than a dashboard panel.
func TestGrafanaDashboard(t *testing.T) {
	families := exported(t)
	b, err := os.ReadFile("../../docs/grafana/kiln.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("docs/grafana/kiln.json: %v", err)
	}
	type query struct{ where, expr string }
	var queries []query
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries = append(queries, query{"panel " + p.Title, tg.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		queries = append(queries, query{"variable", v.Definition})
	}
	if len(queries) < 15 {
		t.Fatalf("the dashboard has only %d queries", len(queries))
	}
	used := map[string]bool{}
	for _, q := range queries {
		for _, p := range checkQuery(families, q.expr, used) {
			t.Errorf("%s: %q: %s", q.where, q.expr, p)
		}
	}
	for _, n := range []string{"kiln_sandboxes", "kiln_sandbox_create_seconds", "kiln_commands_finished_total",
		"kiln_http_request_duration_seconds", "kiln_sandbox_cpu_seconds_total", "kiln_sandbox_memory_bytes",
		"kiln_pool_size", "kiln_template_builds_total"} {
		if !used[n] {
			t.Errorf("the dashboard shows no panel of %s", n)
		}
	}
}

// TestMetricsOf: the expression reader finds metric names and labels, and
// so would catch a misspelt one.
func TestMetricsOf(t *testing.T) {
	for _, tc := range []struct {
		expr          string
		names, labels []string
		bad           int
	}{
		{`sum by (state) (kiln_sandboxes{instance=~"$instance"})`, []string{"kiln_sandboxes"}, []string{"instance", "state"}, 0},
		{`histogram_quantile(0.95, sum by (le, route) (rate(kiln_http_request_duration_seconds_bucket{code="5xx"}[$__rate_interval])))`,
			[]string{"kiln_http_request_duration_seconds_bucket"}, []string{"code", "le", "route"}, 0},
		{`a_metric / b_metric`, []string{"a_metric", "b_metric"}, nil, 0},
		{`sumx(kiln_sandboxes)`, []string{"kiln_sandboxes"}, nil, 1},
	} {
		names, labels, bad := metricsOf(tc.expr)
		slices.Sort(labels)
		if !slices.Equal(names, tc.names) || !slices.Equal(labels, tc.labels) || len(bad) != tc.bad {
			t.Errorf("%q: names %v labels %v bad %v; want %v %v %d", tc.expr, names, labels, bad, tc.names, tc.labels, tc.bad)
		}
	}
	// checkQuery catches a misspelt metric, a label the metric lacks, le
	// on a histogram's _sum, and a bad variable query.
	families := exported(t)
	for expr, want := range map[string]int{
		`sum by (state) (kiln_sandbox{instance=~"$instance"})`:                2, // no such metric, so no state label either
		`sum by (template) (kiln_sandboxes)`:                                  1,
		`sum by (le) (rate(kiln_sandbox_create_seconds_sum[5m]))`:             1,
		`sum by (le) (rate(kiln_sandbox_create_seconds_bucket[5m]))`:          0,
		`label_values(kiln_sandboxes, node)`:                                  1,
		`label_values(kiln_sandboxes, instance)`:                              0,
		`sum(rate(kiln_http_request_duration_seconds_count{code="5xx"}[5m]))`: 0,
	} {
		if got := checkQuery(families, expr, map[string]bool{}); len(got) != want {
			t.Errorf("%s: problems %v, want %d", expr, got, want)
		}
	}
}

package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/template"
)

// MaxPoolSize bounds one template's pool of ready sandboxes.
const MaxPoolSize = 64

// Pools are the sizes of the warm pools of ready sandboxes, by template
// reference (KILN_POOL / kiln serve --pool, e.g.
// "code-interpreter=2,base=4,site:v2=1"): "name" or "name:tag", as
// template.ParseRef reads them; "name:default" is kept as "name". It is a
// flag.Value.
type Pools map[string]int

// ParsePools parses "ref=size,ref=size"; "" is no pools.
func ParsePools(s string) (Pools, error) {
	p := Pools{}
	return p, p.Set(s)
}

// Set replaces p's contents with the parsed s (flag.Value).
func (p Pools) Set(s string) error { return p.set(s, MaxPoolSize) }

// MaxClusterPoolSize bounds one template's pool size across a cluster.
const MaxClusterPoolSize = 100000

// ClusterPools are pool sizes across a cluster's live nodes
// (KILN_CLUSTER_POOL / kiln serve --cluster-pool), written as Pools; it
// is a flag.Value.
type ClusterPools map[string]int

// Set replaces p's contents with the parsed s (flag.Value).
func (p ClusterPools) Set(s string) error { return Pools(p).set(s, MaxClusterPoolSize) }

func (p ClusterPools) String() string { return Pools(p).String() }

// set parses s into p, each size at most limit.
func (p Pools) set(s string, limit int) error {
	clear(p)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		ref, size, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(strings.TrimSpace(size))
		name, tag, rerr := template.ParseRef(strings.TrimSpace(ref))
		switch {
		case !ok || err != nil || rerr != nil:
			return fmt.Errorf("pool %q: want TEMPLATE[:TAG]=SIZE, e.g. code-interpreter=2 or site:v2=1", item)
		case n < 0 || n > limit:
			return fmt.Errorf("pool %q: size must be 0-%d", item, limit)
		}
		if tag != template.DefaultTag {
			name += ":" + tag
		}
		p[name] = n
	}
	return nil
}

// String formats p as Set parses it, sorted by name.
func (p Pools) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(p)) {
		parts = append(parts, k+"="+strconv.Itoa(p[k]))
	}
	return strings.Join(parts, ",")
}

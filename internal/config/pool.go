package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// MaxPoolSize bounds one template's pool of ready sandboxes.
const MaxPoolSize = 64

// Pools are the sizes of the warm pools of ready sandboxes, by template
// name (KILN_POOL / kiln serve --pool, e.g. "code-interpreter=2,base=4").
// It is a flag.Value.
type Pools map[string]int

var poolNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ParsePools parses "name=size,name=size"; "" is no pools.
func ParsePools(s string) (Pools, error) {
	p := Pools{}
	return p, p.Set(s)
}

// Set replaces p's contents with the parsed s (flag.Value).
func (p Pools) Set(s string) error {
	clear(p)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, size, ok := strings.Cut(item, "=")
		n, err := strconv.Atoi(strings.TrimSpace(size))
		name = strings.TrimSpace(name)
		switch {
		case !ok || err != nil || !poolNameRE.MatchString(name):
			return fmt.Errorf("pool %q: want TEMPLATE=SIZE, e.g. code-interpreter=2", item)
		case n < 0 || n > MaxPoolSize:
			return fmt.Errorf("pool %q: size must be 0-%d", item, MaxPoolSize)
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

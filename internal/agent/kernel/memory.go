package kernel

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Memory admits kernels against the sandbox's memory limit. Every kernel
// is an interpreter that stays resident (a Python kernel is tens of MiB
// idle), and on gVisor a sandbox that outgrows its host cgroup is killed
// whole; so before a kernel starts, its expected footprint must fit under
// the limit less Headroom, counting each running kernel at the larger of
// its language's estimate and its actual RSS (a kernel still importing
// its libraries has not reached its footprint yet) and each kernel being
// started at its estimate. A kernel that does not fit is refused with
// resource_exhausted.
type Memory struct {
	// Limit is the sandbox's memory limit in bytes; 0 turns admission off.
	Limit int64
	// Headroom is kept free for the code the kernels run; 0:
	// DefaultHeadroom(Limit).
	Headroom int64
	// Usage reports the sandbox's memory use now (kernels included).
	Usage func() (int64, error)
	// Estimates are the idle footprints per canonical language; a
	// language without one counts as DefaultEstimate.
	Estimates map[string]int64
	// RSS reports the resident bytes of a process and its descendants;
	// nil: read from /proc (TreeRSS).
	RSS func(pid int) int64
}

// DefaultEstimates are idle kernels' footprints, measured in a
// code-interpreter sandbox under gVisor: the growth of the sandbox's
// memory use when the first kernel of a language starts (Python 75 MiB,
// Node 96 MiB, R 115 MiB; later ones share pages and cost less) and the
// kernel's RSS (Python 95 MiB, Node 114 MiB, R 172 MiB). Rounded up: a
// kernel counts at its estimate until its RSS passes it. The compiled
// languages start no process until code runs.
var DefaultEstimates = map[string]int64{
	"python":     96 << 20,
	"r":          160 << 20,
	"javascript": 96 << 20,
	"typescript": 128 << 20,
	"bash":       8 << 20,
}

// DefaultEstimate is the footprint of a language missing from the
// estimates.
const DefaultEstimate = 32 << 20

// DefaultHeadroom is the memory admission keeps free under a limit: an
// eighth of it, at least 32 MiB and at most 256 MiB.
func DefaultHeadroom(limit int64) int64 {
	return min(max(limit/8, 32<<20), 256<<20)
}

func (m Memory) enabled() bool { return m.Limit > 0 && m.Usage != nil }

func (m Memory) estimate(language string) int64 {
	if e, ok := m.Estimates[language]; ok {
		return e
	}
	if e, ok := DefaultEstimates[language]; ok {
		return e
	}
	return DefaultEstimate
}

func (m Memory) rss(pid int) int64 {
	if m.RSS != nil {
		return m.RSS(pid)
	}
	return TreeRSS(pid)
}

// PIDer is a Kernel whose interpreter is a process; PID returns it (0
// while there is none). Admission counts such a kernel's actual RSS.
type PIDer interface {
	PID() int
}

// admit reserves memory for a kernel of language about to start, or says
// why it does not fit; release gives the reservation back once the
// kernel is registered (or failed). Callers hold no lock.
//
// A deleted kernel's memory shows up free a moment after its process is
// gone (gVisor returns pages to its usage accounting asynchronously), so
// within a few seconds of a delete a kernel that does not fit waits for the use
// to fall before it is refused: deleting a context and creating another
// works at once.
func (c *Contexts) admit(ctx context.Context, language string) (release func(), err error) {
	m := c.cfg.Memory
	if !m.enabled() {
		return func() {}, nil
	}
	need := m.estimate(language)
	for {
		refused, settling := c.reserve(language, need)
		if refused == nil {
			return func() {
				c.amu.Lock()
				c.starting -= need
				c.amu.Unlock()
			}, nil
		}
		if settling <= 0 {
			return nil, refused
		}
		t := time.NewTimer(min(settling, settlePoll))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, refused
		case <-t.C:
		}
	}
}

// settle is how long after a delete admission waits for the freed
// memory to show; settlePoll how often it looks meanwhile.
const (
	settle     = 5 * time.Second
	settlePoll = 100 * time.Millisecond
)

// reserve reserves need bytes for a kernel of language if they fit (nil),
// or returns the refusal and how much longer a recent delete may still
// free memory.
func (c *Contexts) reserve(language string, need int64) (refused error, settling time.Duration) {
	m := c.cfg.Memory
	c.amu.Lock()
	defer c.amu.Unlock()
	used, err := m.Usage()
	if err != nil {
		c.log.Warn("reading memory use; starting the kernel unchecked", "err", err)
		c.starting += need
		return nil, 0
	}
	held := c.starting
	for _, k := range c.running() {
		p, ok := k.k.(PIDer)
		if !ok {
			continue
		}
		if pid := p.PID(); pid > 0 {
			held += max(m.estimate(k.lang)-m.rss(pid), 0)
		}
	}
	headroom := cmp.Or(m.Headroom, DefaultHeadroom(m.Limit))
	if used+held+need <= m.Limit-headroom {
		c.starting += need
		return nil, 0
	}
	settling = settle - time.Since(c.freed)
	if settling <= 0 {
		c.log.Warn("refusing a kernel: not enough memory", "language", language, "used", used, "held", held,
			"need", need, "limit", m.Limit, "headroom", headroom)
	}
	return &api.Error{Code: api.CodeResourceExhausted, Message: fmt.Sprintf(
		"not enough memory for another %s context: the sandbox's limit is %d MiB, %d MiB are in use or held for "+
			"starting kernels, a %s kernel needs about %d MiB and %d MiB are kept free for running code; "+
			"delete a context or use a sandbox with more memory",
		language, m.Limit>>20, (used+held)>>20, language, need>>20, headroom>>20)}, settling
}

type runningKernel struct {
	lang string
	k    Kernel
}

// running lists the started kernels.
func (c *Contexts) running() []runningKernel {
	c.mu.Lock()
	es := make([]*entry, 0, len(c.byID))
	for _, e := range c.byID {
		es = append(es, e)
	}
	c.mu.Unlock()
	var out []runningKernel
	for _, e := range es {
		e.mu.Lock()
		if e.k != nil {
			out = append(out, runningKernel{lang: e.info.Language, k: e.k})
		}
		e.mu.Unlock()
	}
	return out
}

// TreeRSS returns the resident bytes of pid and its descendants, from
// /proc (0 if pid is gone).
func TreeRSS(pid int) int64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	children := map[int][]int{}
	rss := map[int]int64{}
	page := int64(os.Getpagesize())
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, pages, ok := readStat(p)
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], p)
		rss[p] = pages * page
	}
	var total int64
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		total += rss[p]
		todo = append(todo, children[p]...)
	}
	return total
}

// readStat returns a process's parent and resident pages from
// /proc/<pid>/stat.
func readStat(pid int) (ppid int, pages int64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// Fields after the command, which is in parentheses and may hold
	// anything: state ppid pgrp ... rss is the 24th field overall.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pages, err2 := strconv.ParseInt(f[21], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ppid, pages, true
}

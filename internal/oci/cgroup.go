package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// cgroupRoot is where the v1 controllers are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupControllers are the v1 hierarchies runc and runsc populate.
var cgroupControllers = []string{
	"memory", "cpu", "cpuacct", "cpuset", "pids", "freezer", "blkio", "devices",
	"net_cls", "net_prio", "perf_event", "hugetlb", "rdma", "systemd",
}

// Stats are a sandbox's cgroup (v1) counters. Both runc and runsc put the
// sandbox at <controller>/<cgroupsPath> under /sys/fs/cgroup; for runsc
// that cgroup holds the whole sandbox (Sentry, gofer and their threads),
// so memory includes gVisor's own overhead.
type Stats struct {
	MemoryUsage    int64 // bytes, page cache included
	MemoryMaxUsage int64 // high-water mark
	MemoryLimit    int64 // bytes; a huge number when unlimited
	MemoryFailcnt  int64 // times usage hit the limit
	OOMKills       int64 // processes killed by the OOM killer
	CPUUsage       time.Duration
	Pids           int64
	PidsLimit      int64 // 0 when unlimited
}

// CgroupStats reads the stats of the cgroup at cgroupsPath (as in the spec,
// e.g. "/kiln/<id>"). A missing cgroup is errdefs.ErrNotFound.
func CgroupStats(cgroupsPath string) (Stats, error) {
	rel, err := cleanCgroupsPath(cgroupsPath)
	if err != nil {
		return Stats{}, err
	}
	mem := filepath.Join(cgroupRoot, "memory", rel)
	if _, err := os.Stat(mem); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Stats{}, fmt.Errorf("reading cgroup %s: %w", cgroupsPath, errdefs.ErrNotFound)
		}
		return Stats{}, fmt.Errorf("reading cgroup %s: %w", cgroupsPath, err)
	}
	var s Stats
	r := statReader{}
	s.MemoryUsage = r.int(mem, "memory.usage_in_bytes")
	s.MemoryMaxUsage = r.int(mem, "memory.max_usage_in_bytes")
	s.MemoryLimit = r.int(mem, "memory.limit_in_bytes")
	s.MemoryFailcnt = r.int(mem, "memory.failcnt")
	s.OOMKills = r.field(mem, "memory.oom_control", "oom_kill")
	s.CPUUsage = time.Duration(r.int(filepath.Join(cgroupRoot, "cpuacct", rel), "cpuacct.usage"))
	pids := filepath.Join(cgroupRoot, "pids", rel)
	s.Pids = r.int(pids, "pids.current")
	if max := r.str(pids, "pids.max"); max != "max" && max != "" {
		s.PidsLimit, _ = strconv.ParseInt(max, 10, 64)
	}
	if r.err != nil {
		return s, fmt.Errorf("reading cgroup %s: %w", cgroupsPath, r.err)
	}
	return s, nil
}

// statReader keeps the first error so reads can be chained.
type statReader struct{ err error }

func (r *statReader) str(dir, file string) string {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		if r.err == nil {
			r.err = err
		}
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (r *statReader) int(dir, file string) int64 {
	s := r.str(dir, file)
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("parsing %s: %w", file, err)
	}
	return n
}

// field reads "key value" lines, as in memory.oom_control.
func (r *statReader) field(dir, file, key string) int64 {
	sc := bufio.NewScanner(bytes.NewReader([]byte(r.str(dir, file))))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// cleanCgroupsPath makes cgroupsPath relative and refuses escapes and the root.
func cleanCgroupsPath(p string) (string, error) {
	if !path.IsAbs(p) || strings.Contains(p, ":") || slices.Contains(strings.Split(p, "/"), "..") {
		return "", fmt.Errorf("checking cgroups path %q: %w", p, errdefs.ErrInvalidArgument)
	}
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("checking cgroups path %q: %w", p, errdefs.ErrInvalidArgument)
	}
	return rel, nil
}

// removeCgroups removes the cgroup at cgroupsPath from every controller;
// rmdir fails while tasks remain, so it retries briefly for exiting ones.
func removeCgroups(ctx context.Context, cgroupsPath string) error {
	rel, err := cleanCgroupsPath(cgroupsPath)
	if err != nil {
		return err
	}
	var errs []error
	for _, ctrl := range cgroupControllers {
		dir := filepath.Join(cgroupRoot, ctrl, rel)
		for delay := time.Millisecond; ; delay *= 2 {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if delay > 200*time.Millisecond || ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(delay)
		}
	}
	return errors.Join(errs...)
}

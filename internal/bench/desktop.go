package bench

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// DesktopResult measures the desktop template (issue 18) on runsc: a
// desktop brought up as E2B's desktop SDK brings it up (the same commands,
// the same waits), booted cold and restored from the warm snapshot; its
// screenshots; its idle memory.
type DesktopResult struct {
	Samples         int    `json:"samples"`
	CheckpointBytes int64  `json:"checkpoint_bytes"` // memory image of the warm snapshot
	WarmBuild       string `json:"warm_build"`

	ColdCreate Dist   `json:"cold_create"`      // Create returned
	ColdReady  Dist   `json:"cold_sdk_ready"`   // create → the SDK's start sequence done
	ColdShot   Dist   `json:"cold_first_shot"`  // create → first screenshot read
	ColdDrawn  Dist   `json:"cold_first_drawn"` // create → first screenshot that is not blank
	WarmCreate Dist   `json:"warm_create"`      // Create returned (restore)
	WarmReady  Dist   `json:"warm_sdk_ready"`   // create → the SDK's start sequence done
	WarmShot   Dist   `json:"warm_first_shot"`  // create → first screenshot read
	WarmDrawn  Dist   `json:"warm_first_drawn"` // create → first screenshot that is not blank
	Shot       Dist   `json:"screenshot"`       // scrot, read the PNG, remove it (what the SDK's screenshot() does)
	ShotBytes  int    `json:"screenshot_bytes"` // the PNG's size
	ScrotOnly  Dist   `json:"screenshot_scrot"` // the scrot command alone
	ReadOnly   Dist   `json:"screenshot_read"`  // reading the PNG alone
	IdleWarm   Mem    `json:"idle_warm"`        // a restored desktop, up, idle
	IdleCold   Mem    `json:"idle_cold"`        // a booted desktop, up, idle
	Limits     string `json:"limits"`
}

// Mem is a sandbox's memory on the host.
type Mem struct {
	PSS    int64 `json:"pss_bytes"`        // summed PSS of its host processes (sentry, gofer)
	Cgroup int64 `json:"cgroup_rss_bytes"` // its cgroup's rss
	// Usage is what its memory limit counts: the cgroup's usage, which
	// holds gVisor's memory file (shared memory, not rss).
	Usage int64 `json:"cgroup_usage_bytes"`
}

// The desktop SDK's create runs these (its defaults: display :0,
// 1024x768, 96 dpi), each through bash -l like envd's commands, waiting
// between checks as it does.
const (
	sdkXvfb      = "Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix"
	sdkXvfbCheck = "xdpyinfo -display :0"
	sdkXfce      = "startxfce4"
	sdkXfceCheck = "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null"
	sdkCheckWait = 500 * time.Millisecond
)

// Desktop measures n cold and n warm desktops, screenshots on one, and
// the idle memory of one of each.
func Desktop(ctx context.Context, m *sandbox.Manager, im *sandbox.Images, n int, progress io.Writer) (*DesktopResult, error) {
	const tmpl = "desktop"
	r := &DesktopResult{Samples: n}
	fmt.Fprintf(progress, "bench: warm snapshot of %s\n", tmpl)
	c, err := im.BuildWarm(ctx, tmpl)
	if err != nil {
		return nil, err
	}
	r.WarmBuild = c.Took
	r.Limits = fmt.Sprintf("%g CPUs, %s memory", c.Limits.CPUs, mib(c.Limits.MemoryBytes))
	_ = filepath.Walk(c.Image(), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			r.CheckpointBytes += fi.Size()
		}
		return nil
	})

	// up creates a desktop and starts it as the SDK does; keep leaves it
	// running (the caller kills it).
	up := func(cold bool, keep bool) (id sandbox.ID, create, ready, shot, drawn time.Duration, err error) {
		start := time.Now()
		sb, err := m.Create(ctx, sandbox.CreateOptions{Template: tmpl, Runtime: "runsc", Cold: cold})
		if err != nil {
			return id, 0, 0, 0, 0, err
		}
		id, create = sb.ID, time.Since(start)
		if !keep {
			defer m.Kill(context.WithoutCancel(ctx), sb.ID)
		}
		a, err := m.Agent(sb.ID)
		if err != nil {
			return id, 0, 0, 0, 0, err
		}
		if err := sdkStart(ctx, a); err != nil {
			return id, 0, 0, 0, 0, err
		}
		ready = time.Since(start)
		for i := 0; ; i++ {
			b, err := screenshot(ctx, a, fmt.Sprintf("/tmp/bench-%d.png", i))
			if err != nil {
				return id, 0, 0, 0, 0, err
			}
			if i == 0 {
				shot = time.Since(start)
			}
			if drawnPNG(b) {
				break
			}
			if time.Since(start) > time.Minute {
				return id, 0, 0, 0, 0, fmt.Errorf("the desktop stays blank")
			}
		}
		return id, create, ready, shot, time.Since(start), nil
	}

	for _, cold := range []bool{true, false} {
		var cr, rd, sh, dr []time.Duration
		fmt.Fprintf(progress, "bench: %d desktops (cold %v)\n", n, cold)
		for range n {
			_, create, ready, shot, drawn, err := up(cold, false)
			if err != nil {
				return nil, fmt.Errorf("desktop (cold %v): %w", cold, err)
			}
			cr, rd, sh, dr = append(cr, create), append(rd, ready), append(sh, shot), append(dr, drawn)
		}
		if cold {
			r.ColdCreate, r.ColdReady, r.ColdShot, r.ColdDrawn = dist(cr), dist(rd), dist(sh), dist(dr)
		} else {
			r.WarmCreate, r.WarmReady, r.WarmShot, r.WarmDrawn = dist(cr), dist(rd), dist(sh), dist(dr)
		}
	}

	fmt.Fprintf(progress, "bench: screenshots and idle memory\n")
	for _, cold := range []bool{false, true} {
		id, _, _, _, _, err := up(cold, true)
		if err != nil {
			return nil, err
		}
		defer m.Kill(context.WithoutCancel(ctx), id)
		mem := &r.IdleCold
		if !cold {
			mem = &r.IdleWarm
			if err := r.screenshots(ctx, m, id, 4*n); err != nil {
				return nil, err
			}
		}
		time.Sleep(5 * time.Second) // idle: let the start settle
		if mem.PSS, mem.Cgroup, err = sandboxMemory(id); err != nil {
			return nil, err
		}
		usage, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/kiln", id.String(), "memory.usage_in_bytes"))
		mem.Usage, _ = strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
	}
	return r, nil
}

// screenshots measures n screenshot round trips on the desktop id, and
// their two parts.
func (r *DesktopResult) screenshots(ctx context.Context, m *sandbox.Manager, id sandbox.ID, n int) error {
	a, err := m.Agent(id)
	if err != nil {
		return err
	}
	var all, scrots, reads []time.Duration
	for i := range n {
		t0 := time.Now()
		b, err := screenshot(ctx, a, fmt.Sprintf("/tmp/shot-%d.png", i))
		if err != nil {
			return err
		}
		all = append(all, time.Since(t0))
		r.ShotBytes = len(b)
		t0 = time.Now()
		if err := run(ctx, a, "scrot --pointer /tmp/shot.png"); err != nil {
			return err
		}
		scrots = append(scrots, time.Since(t0))
		t0 = time.Now()
		if _, err := a.ReadFile(ctx, wire.PathParams{Path: "/tmp/shot.png"}, io.Discard); err != nil {
			return err
		}
		reads = append(reads, time.Since(t0))
	}
	r.Shot, r.ScrotOnly, r.ReadOnly = dist(all), dist(scrots), dist(reads)
	return nil
}

// sdkStart runs the desktop SDK's start sequence in the sandbox.
func sdkStart(ctx context.Context, a *sandbox.Agent) error {
	for _, step := range []struct{ start, check string }{{sdkXvfb, sdkXvfbCheck}, {sdkXfce, sdkXfceCheck}} {
		if err := background(ctx, a, step.start); err != nil {
			return err
		}
		for deadline := time.Now().Add(time.Minute); ; {
			if run(ctx, a, step.check) == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%q never succeeded", step.check)
			}
			time.Sleep(sdkCheckWait)
		}
	}
	return nil
}

// background starts cmd and returns once it runs, leaving it running.
func background(ctx context.Context, a *sandbox.Agent, cmd string) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops following: the process runs on
	started := make(chan error, 1)
	go func() {
		_, err := a.Exec(fctx, wire.ExecParams{Cmd: cmd}, func(ev api.Event) error {
			if ev.Type == api.EventStart {
				started <- nil
			}
			return nil
		})
		started <- err
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting %q: %w", cmd, err)
	}
	return nil
}

// run runs cmd to its end and fails unless it exits 0.
func run(ctx context.Context, a *sandbox.Agent, cmd string) error {
	exit, err := a.Exec(ctx, wire.ExecParams{Cmd: cmd, TimeoutMs: 60_000}, func(api.Event) error { return nil })
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return fmt.Errorf("%q exited %d", cmd, exit.Code)
	}
	return nil
}

// screenshot does what the SDK's screenshot() does: scrot into a file,
// read it, remove it.
func screenshot(ctx context.Context, a *sandbox.Agent, path string) ([]byte, error) {
	if err := run(ctx, a, "scrot --pointer "+path); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := a.ReadFile(ctx, wire.PathParams{Path: path}, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), a.Remove(ctx, wire.PathParams{Path: path})
}

// drawnPNG reports whether a screenshot shows something: not (nearly) one
// colour.
func drawnPNG(b []byte) bool {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return false
	}
	counts := map[uint32]int{}
	top := 0
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			k := cr>>8<<16 | cg>>8<<8 | cb>>8
			counts[k]++
			top = max(top, counts[k])
		}
	}
	return len(counts) >= 16 && float64(top) <= 0.99*float64(r.Dx()*r.Dy())
}

// WriteMarkdown renders the section for docs/benchmarks.md.
func (r *DesktopResult) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n## Desktop (issue 18, runsc, `desktop`)\n\n")
	fmt.Fprintf(w, "`kiln bench --desktop`: %d desktops each way (%s), each brought up with the commands E2B's desktop SDK runs at create "+
		"(Xvfb, `xdpyinfo` until it answers, `startxfce4`, `pgrep` until the session is up; 500 ms between checks, as the SDK waits), "+
		"then screenshots as the SDK takes them (`scrot --pointer`, read the PNG, remove it) until one is not blank. "+
		"The warm snapshot (the desktop up) has a %s memory image and took %s to build.\n\n", r.Samples, r.Limits, mib(r.CheckpointBytes), r.WarmBuild)
	fmt.Fprintf(w, "| how | `Create` p50 | create → SDK start done p50 | create → first screenshot p50 | p95 | create → first drawn screenshot p50 | p95 |\n|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| cold boot | %s | %s | %s | %s | %s | %s |\n", ms(r.ColdCreate.P50), ms(r.ColdReady.P50), ms(r.ColdShot.P50), ms(r.ColdShot.P95), ms(r.ColdDrawn.P50), ms(r.ColdDrawn.P95))
	fmt.Fprintf(w, "| warm snapshot (restore, desktop up) | %s | %s | %s | %s | %s | %s |\n", ms(r.WarmCreate.P50), ms(r.WarmReady.P50), ms(r.WarmShot.P50), ms(r.WarmShot.P95), ms(r.WarmDrawn.P50), ms(r.WarmDrawn.P95))
	fmt.Fprintf(w, "\nScreenshot round trip (1024×768 PNG, %d KiB) on a desktop that is up: p50 %s, p95 %s; of which `scrot` p50 %s, reading the file p50 %s.\n\n",
		r.ShotBytes>>10, ms(r.Shot.P50), ms(r.Shot.P95), ms(r.ScrotOnly.P50), ms(r.ReadOnly.P50))
	fmt.Fprintf(w, "Idle memory of a desktop that is up (XFCE, no application open), 5 s after start, on the host: restored from the warm snapshot "+
		"%s PSS (cgroup usage %s, rss %s); booted cold %s PSS (cgroup usage %s, rss %s). The cgroup's usage is what the sandbox's memory limit counts "+
		"(gVisor's memory is a shared file, so little of it is rss).\n",
		mib(r.IdleWarm.PSS), mib(r.IdleWarm.Usage), mib(r.IdleWarm.Cgroup), mib(r.IdleCold.PSS), mib(r.IdleCold.Usage), mib(r.IdleCold.Cgroup))
}

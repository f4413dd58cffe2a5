package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/bench"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// benchCmd runs the benchmarks and writes docs/benchmarks.md and its JSON.
// A benchmark is a flag here and a bench function returning a
// bench.Section, added to the report in the order below.
func benchCmd(ctx context.Context, cfg config.Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	rts := fs.String("runtimes", "runsc,runc", "comma-separated runtimes to measure")
	core := fs.Bool("core", true, "sequential create, command round trip, idle memory and the bubblewrap floor")
	creates := fs.Int("creates", 30, "sandboxes to create per runtime")
	execs := fs.Int("execs", 200, "command round trips per runtime")
	idle := fs.Int("idle", 10, "idle sandboxes to measure memory over")
	levels := fs.String("concurrency", "1,10,50", "concurrent-create levels (\"\" skips)")
	levelSamples := fs.Int("concurrency-samples", 50, "creates per concurrency level (at least the level)")
	density := fs.String("density", "2G", "memory budget for the density run (\"\" skips)")
	densityMax := fs.Int("density-max", 100, "most idle sandboxes the density run makes per runtime")
	var ds bench.DensityStepsOptions
	fs.IntVar(&ds.Step, "density-steps", 0, "stepwise density run: idle sandboxes added this many at a time, the host measured after each step (0 skips)")
	fs.IntVar(&ds.Max, "density-steps-max", 1000, "most sandboxes the stepwise density run makes")
	fs.StringVar(&ds.Runtime, "density-steps-runtime", "runsc", "runtime of the stepwise density run")
	fs.DurationVar(&ds.Idle, "density-steps-idle", 5*time.Second, "idle time over which each step's idle CPU is measured")
	densityFloor := fs.String("density-steps-floor", "4G", "the stepwise density run stops adding before MemAvailable would fall below this")
	churn := fs.Duration("churn", time.Minute, "create/kill loop per runtime, with leak and baseline checks (0 skips)")
	serverURL := fs.String("server", "", "drive a running kiln serve at this URL (KILN_API_KEY) for the concurrency, density and churn runs; the rest is skipped")
	out := fs.String("out", "docs/benchmarks.md", "markdown report to write (- for stdout only)")
	jsonOut := fs.String("json", "docs/benchmarks.json", "JSON report to write (\"\" for none)")
	load := fs.Bool("load", true, "also load the API: concurrent creates and commands through a real server")
	code := fs.Bool("code", true, "also measure the code interpreter (needs the code-interpreter template)")
	warm := fs.Bool("warm", true, "code-interpreter creates on runsc: cold, from the warm template, from a pool")
	warmN := fs.Int("warm-samples", 10, "creates per way in the warm run")
	tmpls := fs.Bool("templates", false, "custom templates on runsc: first and cached build of a Dockerfile (reaches the Debian mirror through sandbox networking, on unless KILN_NETWORK=off), creates cold, from its warm snapshot, from a pool")
	tmplN := fs.Int("templates-samples", 10, "creates per way in the templates run")
	desktop := fs.Bool("desktop", false, "the desktop template on runsc (kiln template build desktop first): desktops brought up as E2B's desktop SDK does, cold and from the warm snapshot, screenshots, idle memory")
	desktopN := fs.Int("desktop-samples", 5, "desktops per way in the desktop run")
	snaps := fs.Bool("snapshots", true, "pause, resume, fork and snapshot latency on runsc against working-set size")
	snapSizes := fs.String("snapshot-sizes", "50M,256M,500M,2G", "working sets for --snapshots")
	snapN := fs.Int("snapshot-samples", 3, "samples per operation and size for --snapshots")
	lo := bench.LoadOptions{}
	fs.StringVar(&lo.Runtime, "load-runtime", "runsc", "runtime of the load run")
	fs.IntVar(&lo.Sandboxes, "load-sandboxes", 50, "sandboxes created concurrently in the load run")
	fs.IntVar(&lo.Commands, "load-commands", 1000, "commands run across them")
	fs.IntVar(&lo.Concurrency, "load-concurrency", 16, "commands in flight")
	fs.IntVar(&lo.Overhead, "overhead", 200, "round trips per path for the API overhead comparison")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (the in-process Manager) to this file")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (templates)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	runtimes := strings.Split(*rts, ",")
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep := bench.NewReport(strings.Join(append([]string{"kiln", "bench"}, args...), " "))
	m, im, st, closeManager, err := privateManager(ctx, cfg, log, "bench-")
	if err != nil {
		return err
	}
	defer closeManager()
	target := bench.Manager(m)
	if *serverURL != "" {
		target = bench.Server(*serverURL, config.Env("KILN_API_KEY"))
		*core, *load, *code, *warm, *snaps, *tmpls, *desktop = false, false, false, false, false, false, false
	}

	if *core {
		opts := bench.Options{Runtimes: runtimes, Creates: *creates, Execs: *execs, Idle: *idle, Progress: os.Stderr}
		if t, err := template.Lookup(cfg.DataDir, "base"); err == nil && len(t.Layers) > 0 {
			opts.Rootfs = t.Layers[0] // Debian, without the recipe's steps
		}
		res, err := bench.Run(ctx, m, opts)
		if err != nil {
			return err
		}
		rep.Add("latency", res)
	}
	if *levels != "" {
		var ls []int
		for _, f := range strings.Split(*levels, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return fmt.Errorf("--concurrency: %q is not a positive number", f)
			}
			ls = append(ls, n)
		}
		res, err := bench.Concurrency(ctx, target, runtimes, ls, *levelSamples, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("concurrency", res)
	}
	if *density != "" {
		budget, err := config.ParseBytes(*density)
		if err != nil {
			return fmt.Errorf("--density: %w", err)
		}
		res, err := bench.Density(ctx, target, runtimes, budget, *densityMax, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("density", res)
	}
	if ds.Step > 0 {
		floor, err := config.ParseBytes(*densityFloor)
		if err != nil || ds.Max < 1 || ds.Idle <= 0 {
			return fmt.Errorf("--density-steps-floor %q, --density-steps-max %d, --density-steps-idle %s: want a size, a positive number and a duration", *densityFloor, ds.Max, ds.Idle)
		}
		ds.Floor = floor
		res, err := bench.DensitySteps(ctx, target, ds, os.Stderr)
		if res != nil {
			rep.Add("density_steps", res)
		}
		if err != nil {
			return err
		}
	}
	if *churn > 0 {
		res, err := bench.Churn(ctx, target, runtimes, *churn, cfg.DataDir, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("churn", res)
	}
	if *code {
		res, err := bench.Code(ctx, m, runtimes, 100, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("code_interpreter", res)
	}
	if *warm && slices.Contains(runtimes, "runsc") {
		res, err := bench.Warm(ctx, m, im, "code-interpreter", *warmN, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("warm", res)
	}
	if *tmpls {
		res, err := benchTemplates(ctx, cfg, log, *tmplN)
		if err != nil {
			return err
		}
		rep.Add("templates", res)
	}
	if *desktop && slices.Contains(runtimes, "runsc") {
		res, err := bench.Desktop(ctx, m, im, *desktopN, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("desktop", res)
	}
	if *snaps && slices.Contains(runtimes, "runsc") {
		o := bench.SnapshotOptions{Samples: *snapN, Fork4Max: 512 << 20, Fork16Max: 256 << 20}
		for _, f := range strings.Split(*snapSizes, ",") {
			n, err := config.ParseBytes(f)
			if err != nil || n <= 0 {
				return fmt.Errorf("--snapshot-sizes: %q is not a size", f)
			}
			o.Sizes = append(o.Sizes, n)
		}
		res, err := bench.Snapshots(ctx, m, im, o, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("snapshots", res)
	}
	if *load {
		lo.Config = cfg
		res, err := bench.Load(ctx, m, st, lo, os.Stderr)
		if err != nil {
			return err
		}
		rep.Add("api_load", res)
	}
	return writeReport(rep, *out, *jsonOut)
}

// writeReport prints the markdown and writes it and the JSON to files.
func writeReport(rep *bench.Report, out, jsonOut string) error {
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	os.Stdout.Write(b.Bytes())
	if jsonOut != "" {
		j, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := writeFile(jsonOut, append(j, '\n')); err != nil {
			return err
		}
	}
	if out == "-" {
		return nil
	}
	// Hand-written sections (benchmarks run by go test) below the marker
	// survive a new run.
	if old, err := os.ReadFile(out); err == nil {
		if i := bytes.Index(old, []byte(keepMarker)); i >= 0 {
			b.WriteString("\n")
			b.Write(old[i:])
		}
	}
	return writeFile(out, b.Bytes())
}

const keepMarker = "<!-- kiln bench keeps everything below this line: hand-written sections -->"

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", path)
	return os.WriteFile(path, b, 0o644)
}

// benchTemplates runs the templates benchmark on a Manager and Builder of
// its own: a fresh layer store and records in a scratch dir under the
// data dir (the built-in templates shared), and the host's sandbox
// networking for the build's apt-get.
func benchTemplates(ctx context.Context, cfg config.Config, log *slog.Logger, n int) (*bench.TemplatesResult, error) {
	if cfg.Network.Setup == config.NetworkOff {
		return nil, fmt.Errorf("--templates builds with apt-get over NAT: sandbox networking is off (KILN_NETWORK)")
	}
	cfg.Network.Setup = config.NetworkOn // the builds need it: fail if the host cannot
	dir, err := os.MkdirTemp(cfg.DataDir, "bench-templates-")
	if err != nil {
		return nil, fmt.Errorf("creating scratch dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := os.Symlink(template.Dir(cfg.DataDir), template.Dir(dir)); err != nil {
		return nil, err
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "kiln.db"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	layers, err := layer.Open(filepath.Join(dir, "layers"))
	if err != nil {
		return nil, err
	}
	nw, err := openNetwork(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer nw.Close()
	cat := &template.Catalog{DataDir: dir, Store: st}
	m, err := sandbox.NewManager(ctx, sandbox.Config{Config: cfg, StateDir: filepath.Join(dir, "sandboxes"), Store: st,
		Catalog: cat, Net: nw}, runtimes(ctx, cfg), log)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	im, err := sandbox.NewImages(ctx, m)
	if err != nil {
		return nil, err
	}
	b, err := builder.New(ctx, builder.Config{DataDir: dir, Records: st, Layers: layers, Catalog: cat, Sandboxes: m,
		Images: im, Runtime: "runsc", Network: sandbox.NetworkNAT, Log: log})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	return bench.Templates(ctx, bench.TemplatesEnv{Builder: b, Manager: m, Images: im, FilesDir: dir}, n, os.Stderr)
}

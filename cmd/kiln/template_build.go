package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/progress"
)

const templateBuildUsage = `Usage:
  kiln template build -t NAME[:TAG] [-f DOCKERFILE] [flags] CONTEXT_DIR
  kiln template build -t NAME[:TAG] --from-image REF | --from TEMPLATE [--run CMD]... [flags]
  kiln template build [--local] [--force] [--warm=false] [NAME...]

Builds a template on the server and follows its log until the build ends:
a live display on a terminal, plain lines otherwise (--progress). The
Dockerfile (default CONTEXT_DIR/Dockerfile) is compiled here with
BuildKit's parser; the files its COPY and ADD steps need are uploaded from
CONTEXT_DIR (honouring .dockerignore), skipping those the server already
has. Unchanged steps come from the build cache (CACHED). When the build is
ready, NAME:TAG points at it: create sandboxes with
'kiln sandbox create --template NAME[:TAG]'.

A start command (--cmd, else the Dockerfile's CMD/ENTRYPOINT) is left
running, and once the ready command (--ready-cmd, retried until it exits 0;
default: a 20 s wait) succeeds the template is snapshotted, so its
sandboxes start with that process already running.

Without -t it builds Kiln's built-in templates (base, code-interpreter,
desktop; all but desktop when no NAME is given: 'kiln template build
desktop' builds it) on this host, into KILN_DATA_DIR, with no server:
this is what make setup runs (root).

Exit status: 0 when the build is ready; 1 when it failed (the reason names
the step); 2 on a usage error.

Examples:
  kiln template build -t cowsay .
  kiln template build -t app:v2 -f docker/Dockerfile --build-arg VERSION=2 .
  kiln template build -t web --cmd 'python3 -m http.server 8000' \
      --ready-cmd 'curl -sf http://localhost:8000' .
  kiln template build -t tools --from-image debian:bookworm-slim \
      --run 'apt-get update && apt-get install -y curl'
  kiln template build --detach -t cowsay .      # print the build id, return
  kiln template build base                      # local: the built-in base
`

// buildFlags are the flags of kiln template build.
type buildFlags struct {
	tag, file, from, fromImage, registryUser *string
	cmd, readyCmd, progress                  *string
	cpus, memory, disk                       *int
	noCache, public, detach                  *bool
	args                                     envFlag
	run                                      *linesFlag
	local                                    localFlags
}

// linesFlag collects repeated values as they are (commands may hold
// commas).
type linesFlag []string

func (l *linesFlag) String() string { return fmt.Sprint(*l) }
func (l *linesFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func (r *remote) templateBuild(ctx context.Context, cfg config.Config, args []string) error {
	c := r.command("template build", templateBuildUsage)
	fs := c.fs
	f := buildFlags{args: envFlag{}, run: &linesFlag{}}
	f.tag = fs.String("t", "", "the template to build, `NAME[:TAG]` (a server build)")
	fs.StringVar(f.tag, "tag", "", "the same as -t")
	f.file = fs.String("f", "", "the `DOCKERFILE` (default CONTEXT_DIR/Dockerfile)")
	fs.StringVar(f.file, "file", "", "the same as -f")
	fs.Var(f.args, "build-arg", "set a Dockerfile ARG, `KEY=VALUE` (repeatable)")
	f.from = fs.String("from", "", "start from this Kiln `TEMPLATE` instead of a Dockerfile")
	f.fromImage = fs.String("from-image", "", "start from this OCI image `REF` (a registry's) instead of a Dockerfile")
	f.registryUser = fs.String("registry-user", "", "log in to the image's registry as `USER`; the password is read from KILN_REGISTRY_PASSWORD")
	fs.Var(f.run, "run", "with --from or --from-image: a `CMD` to run in the build, as root (repeatable, in order)")
	f.cmd = fs.String("cmd", "", "the start `COMMAND`, left running in the template's snapshot (default: the Dockerfile's CMD/ENTRYPOINT)")
	f.readyCmd = fs.String("ready-cmd", "", "the `COMMAND` retried until it exits 0 before the snapshot is taken (default: a 20 s wait)")
	f.cpus = fs.Int("cpus", 0, "the template's default CPU cores (default: the server's)")
	f.memory = fs.Int("memory", 0, "the template's default memory in `MB` (default: the server's)")
	f.disk = fs.Int("disk", 0, "the template's default writable disk in `MB` (default: the server's)")
	f.noCache = fs.Bool("no-cache", false, "rebuild every step, cached or not")
	f.public = fs.Bool("public", false, "let every key of the server use the template (not change it)")
	f.detach = fs.Bool("detach", false, "print the build id and return at once (follow with 'kiln template logs -f ID')")
	f.progress = fs.String("progress", "auto", "how to show the build: auto, plain or tty")
	f.local.local = fs.Bool("local", false, "build the built-in templates on this host (no server)")
	f.local.force = fs.Bool("force", false, "local: rebuild even if the built-in's build is up to date")
	f.local.warm = fs.Bool("warm", true, "local: also make the warm checkpoints of built-ins with a warm step (root and runsc)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "local: the data directory")
	fs.StringVar(&cfg.Mirror, "mirror", cfg.Mirror, "local: the Debian mirror")
	pos, err := c.parse(args, 0, -1)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	mode := *f.progress
	if mode != "auto" && mode != "plain" && mode != "tty" {
		return c.usageError(fmt.Sprintf("--progress %q: want auto, plain or tty", mode))
	}
	if *f.local.local && *f.tag != "" {
		return c.usageError("--local builds the built-ins here; -t builds NAME on a server: not both")
	}
	if *f.local.local || *f.tag == "" {
		for _, n := range []string{"f", "file", "build-arg", "from", "from-image", "registry-user", "run", "cmd", "ready-cmd",
			"cpus", "memory", "disk", "no-cache", "public", "detach", "json"} {
			if set[n] {
				return c.usageError(fmt.Sprintf("%s builds on a server: give the template's name with -t NAME[:TAG]", dashes(n)))
			}
		}
		return r.buildLocal(ctx, cfg, f.local, mode, pos)
	}
	for _, n := range []string{"force", "warm", "data-dir", "mirror"} {
		if set[n] {
			return c.usageError(fmt.Sprintf("%s is for local builds of the built-ins, not with -t", dashes(n)))
		}
	}
	b, err := r.startBuild(ctx, c, f, pos)
	if err != nil || b == nil {
		return err
	}
	if *f.detach {
		if *c.json {
			return r.printJSON(b)
		}
		fmt.Fprintln(r.stdout, b.ID)
		return nil
	}
	b, err = r.follow(ctx, b.ID, mode, r.stderr)
	if err != nil {
		return err
	}
	if *c.json {
		if err := r.printJSON(b); err != nil {
			return err
		}
	} else if b.Status == api.BuildReady {
		fmt.Fprintf(r.stdout, "%s:%s ready: build %s, %d steps (%d cached)%s\n", b.Template, b.Tag, b.ID, b.Steps, b.CachedSteps,
			map[bool]string{true: ", warm", false: ""}[b.Warm])
	}
	return r.buildExit(b)
}

// startBuild starts the build the flags and arguments describe: a
// Dockerfile's, or one from a template or image with RUN steps.
func (r *remote) startBuild(ctx context.Context, c *command, f buildFlags, pos []string) (*api.TemplateBuild, error) {
	if *f.from != "" || *f.fromImage != "" {
		if *f.from != "" && *f.fromImage != "" || *f.file != "" || len(pos) > 0 || len(f.args) > 0 {
			return nil, c.usageError("--from or --from-image takes no Dockerfile, --build-arg or CONTEXT_DIR, and not both")
		}
		spec := api.TemplateSpec{From: api.TemplateBase{Template: *f.from, Image: *f.fromImage},
			StartCmd: *f.cmd, ReadyCmd: *f.readyCmd, NoCache: *f.noCache, CPUs: *f.cpus, MemoryMB: *f.memory, DiskMB: *f.disk}
		if *f.registryUser != "" {
			spec.From.Registry = &api.RegistryAuth{Username: *f.registryUser, Password: os.Getenv("KILN_REGISTRY_PASSWORD")}
		}
		for _, cmd := range *f.run {
			spec.Steps = append(spec.Steps, api.TemplateStep{Type: api.StepRun, Args: []string{cmd}})
		}
		return r.c.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: *f.tag, Spec: spec, Public: *f.public})
	}
	if len(*f.run) > 0 || *f.registryUser != "" {
		return nil, c.usageError("--run and --registry-user go with --from or --from-image; in a Dockerfile, use RUN")
	}
	if len(pos) != 1 {
		return nil, c.usageError("give one CONTEXT_DIR (the directory COPY and ADD read from, e.g. .)")
	}
	file := *f.file
	if file == "" {
		file = filepath.Join(pos[0], "Dockerfile")
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the Dockerfile: %w", err)
	}
	return r.c.BuildDockerfile(ctx, client.DockerfileBuild{
		Template: *f.tag, Dockerfile: string(text), ContextDir: pos[0], BuildArgs: f.args,
		StartCmd: *f.cmd, ReadyCmd: *f.readyCmd, NoCache: *f.noCache, Public: *f.public,
		CPUs: *f.cpus, MemoryMB: *f.memory, DiskMB: *f.disk,
		OnWarning: func(w string) { fmt.Fprintln(r.stderr, "warning:", w) },
	})
}

// buildExit is the exit of a command that followed build b to its end:
// status 0 when it is ready, 1 (with the reason) when it failed.
func (r *remote) buildExit(b *api.TemplateBuild) error {
	if b.Status != api.BuildReady {
		// The reason names the step; its tail of output is untrusted.
		lines := strings.Split(b.Reason, "\n")
		for i, l := range lines {
			lines[i] = progress.Sanitize(l)
		}
		fmt.Fprintf(r.stderr, "kiln: template build %s failed: %s\n", b.ID, strings.Join(lines, "\n"))
		return exitError{1}
	}
	return nil
}

// follow shows build id's log on w from the start until the build ends
// and returns its final record. A dropped log stream is resumed where it
// stopped.
func (r *remote) follow(ctx context.Context, id, mode string, w io.Writer) (*api.TemplateBuild, error) {
	d, closeDisplay := display(w, mode)
	defer closeDisplay()
	offset := 0
	for attempt := 0; ; attempt++ {
		err := r.c.TemplateBuildLogs(ctx, id, offset, true, func(e api.TemplateLogEntry) error {
			offset++
			d.Add(e)
			return nil
		})
		b, gerr := r.c.TemplateBuild(ctx, id)
		var apiErr *client.Error
		switch {
		case gerr == nil && (b.Status == api.BuildReady || b.Status == api.BuildError):
			return b, nil
		case errors.As(gerr, &apiErr) && apiErr.Code != api.CodeUnavailable:
			return nil, gerr // no such build, or not this key's
		case ctx.Err() != nil:
			return nil, fmt.Errorf("stopped following build %s, which goes on (kiln template logs -f %s): %w", id, id, ctx.Err())
		case gerr != nil && attempt >= 3:
			return nil, gerr
		case attempt >= 3:
			return nil, fmt.Errorf("following build %s: %w", id, errors.Join(err, errors.New("the log ended before the build")))
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt+1) * time.Second):
		}
	}
}

// display is the progress display of a build on w for mode (auto: live on
// a terminal), redrawn as time goes until closed.
func display(w io.Writer, mode string) (*progress.Display, func()) {
	width, tty := progress.Terminal(w)
	live := mode == "tty" || mode == "auto" && tty && os.Getenv("TERM") != "dumb"
	d := progress.New(w, progress.Options{Live: live, Width: width})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				d.Tick()
			}
		}
	}()
	return d, func() {
		close(stop)
		<-done
		d.Close()
	}
}

// dashes is how a flag is written: -f, --file.
func dashes(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

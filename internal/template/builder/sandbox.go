package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// RUN steps execute in a build sandbox: an ordinary sandbox (the one
// bring-up pipeline) whose root filesystem is the stack so far, with NAT
// networking so package managers reach their mirrors. After the command,
// every process is killed and the sandbox's writes flushed to the host
// (gVisor buffers them), and its overlay upper dir is captured as the
// step's layer. The sandbox is killed however the step ends.

// captureExclude are the paths a RUN step's layer leaves out: scratch
// space and the files the sandbox runtime provides.
// /usr/local/bin/sudo is the agent's link to its sudo (internal/agent/sudo),
// made in every sandbox at start.
var captureExclude = []string{"/tmp/*", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/.kiln", "/.kiln/*", "/usr/local/bin/sudo"}

// sandboxRun runs script with /bin/sh -c as user in a build sandbox and
// publishes what it changed under key.
func (r *run) sandboxRun(ctx context.Context, script, user, key string) (_ *layer.Layer, err error) {
	m := r.b.cfg.Sandboxes
	if m == nil {
		return nil, fmt.Errorf("RUN steps need sandboxes, and this builder has none: %w", errdefs.ErrFailedPrecondition)
	}
	tmpl := &template.Template{
		Name: r.rec.Template, Hash: r.rec.ID, Layers: r.dirs, Rootfs: template.Lower(r.dirs),
		Defaults: template.Defaults{User: "root", Workdir: "/"},
	}
	sb, err := m.Create(ctx, sandbox.CreateOptions{
		TemplateBuild: tmpl, Runtime: r.b.cfg.Runtime, Cold: true,
		Limits:   sandbox.Limits{DiskBytes: r.b.cfg.MaxLayerBytes},
		Metadata: map[string]string{MetaBuild: r.rec.ID},
		Timeout:  r.b.cfg.BuildTimeout,
		Network:  &sandbox.NetworkOptions{Mode: r.b.cfg.Network},
	})
	if err != nil {
		return nil, r.hide("starting the build sandbox", err)
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if kerr := m.Kill(kctx, sb.ID); kerr != nil && !errors.Is(kerr, errdefs.ErrNotFound) {
			r.b.log.Warn("killing a build sandbox", "build", r.rec.ID, "sandbox", sb.ID, "err", kerr)
		}
	}()
	_, ag, err := m.UseGranted(ctx, sb.ID)
	if err != nil {
		return nil, r.hide("reaching the build sandbox", err)
	}
	// The workdir may come from a WORKDIR step: make it, as root.
	if _, err := r.exec(ctx, ag, "root", "/", "mkdir -p -- \"$1\"", r.workdir, false); err != nil {
		return nil, r.hide("making the working directory "+r.workdir, err)
	}
	r.tail.reset()
	exit, err := r.exec(ctx, ag, user, r.workdir, script, "", true)
	if err != nil {
		return nil, &stepError{msg: err.Error(), class: err, tail: r.tail.String()}
	}
	if exit.Code != 0 {
		msg := fmt.Sprintf("the command exited with status %d", exit.Code)
		if exit.Signal != "" {
			msg = "the command was killed by " + exit.Signal
		}
		return nil, &stepError{msg: msg, class: errdefs.ErrFailedPrecondition, tail: r.tail.String()}
	}
	// Stop what the step left running, and flush its writes to the host.
	if _, err := r.exec(ctx, ag, "root", "/", "kill -9 -1 2>/dev/null; sync", "", false); err != nil {
		return nil, r.hide("settling the build sandbox", err)
	}
	upper, err := m.UpperDir(sb.ID)
	if err != nil {
		return nil, r.hide("finding the build sandbox's layer", err)
	}
	pend, err := r.b.cfg.Layers.Create()
	if err != nil {
		return nil, r.hide("making a layer", err)
	}
	if err := layer.Capture(ctx, pend.Dir(), upper, layer.CaptureParams{Exclude: captureExclude, Limit: r.b.cfg.MaxLayerBytes, Log: r.b.log}); err != nil {
		_ = pend.Discard()
		return nil, r.hide("capturing the step's changes", err)
	}
	l, err := pend.Publish(ctx, key)
	if err != nil {
		_ = pend.Discard()
		return nil, r.hide("storing the layer", err)
	}
	return l, nil
}

// exec runs script with /bin/sh -c (arg as $1 when given) as user in cwd
// with the build's environment; with logOutput its output goes to the
// build log (and the tail kept for a failure's reason).
func (r *run) exec(ctx context.Context, ag *sandbox.Agent, user, cwd, script, arg string, logOutput bool) (*api.ExitStatus, error) {
	args := []string{"/bin/sh", "-c", script}
	if arg != "" {
		args = append(args, "sh", arg)
	}
	// One splitter per stream: their chunks interleave.
	var stdout, stderr lineSplitter
	out, errOut := func(string) {}, func(string) {}
	if logOutput {
		out, errOut = r.output, r.outputErr
	}
	emit := func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			stdout.write(ev.Data, out)
		case api.EventStderr:
			stderr.write(ev.Data, errOut)
		}
		return nil
	}
	exit, err := ag.Exec(ctx, wire.ExecParams{Args: args, User: user, Cwd: cwd, Env: r.cfg.Env}, emit)
	stdout.flush(out)
	stderr.flush(errOut)
	if err != nil {
		return nil, err
	}
	if exit == nil {
		return nil, errors.New("the build sandbox's agent ended the command without an exit status")
	}
	if !logOutput && exit.Code != 0 {
		return exit, fmt.Errorf("exit status %d: %w", exit.Code, errdefs.ErrFailedPrecondition)
	}
	return exit, nil
}

// lineSplitter cuts a byte stream into lines of at most maxLineBytes.
type lineSplitter struct{ buf []byte }

func (l *lineSplitter) write(p []byte, line func(string)) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) >= maxLineBytes {
				line(string(l.buf[:maxLineBytes]))
				l.buf = l.buf[maxLineBytes:]
				continue
			}
			return
		}
		s := l.buf[:i]
		if len(s) > maxLineBytes {
			s = s[:maxLineBytes]
		}
		line(string(bytes.TrimRight(s, "\r")))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineSplitter) flush(line func(string)) {
	if len(l.buf) > 0 {
		line(string(l.buf))
		l.buf = nil
	}
}

// killBuildSandboxes kills the build sandboxes of build id ("": of every
// build), e.g. those a restart left behind.
func (b *Builder) killBuildSandboxes(ctx context.Context, id string) {
	m := b.cfg.Sandboxes
	for _, sb := range m.Live() {
		v, ok := sb.Metadata[MetaBuild]
		if !ok || id != "" && v != id {
			continue
		}
		if err := m.Kill(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			b.log.Warn("killing a leftover build sandbox", "sandbox", sb.ID, "build", v, "err", err)
			continue
		}
		b.log.Info("killed a leftover build sandbox", "sandbox", sb.ID, "build", v)
	}
}

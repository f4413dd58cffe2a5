package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

var _ Checkpointer = (*CLI)(nil)

// Checkpointer is a Runtime that can save a container's whole state
// (memory, processes, open files) to an image dir and restore it later.
type Checkpointer interface {
	// CanCheckpoint reports whether this runtime supports Checkpoint and
	// Restore (runsc does; runc would need CRIU, which Kiln does not use).
	CanCheckpoint() bool
	// Checkpoint writes the container's image to imageDir. Without
	// leaveRunning the container stops once the image is written.
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error
	// Restore creates container id from b and resumes it from the image
	// in imageDir, with io as its init process's stdio (the container's
	// stdio are re-attached to io); a container id already created from
	// b (not started) is restored into, with the stdio of its create.
	Restore(ctx context.Context, id string, b *Bundle, imageDir string, io IO) error
}

// CanCheckpoint is true for runsc.
func (c *CLI) CanCheckpoint() bool { return c.name == "runsc" }

// Checkpoint saves the container to imageDir (which it creates). A full
// disk is errdefs.ErrResourceExhausted.
func (c *CLI) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if !c.CanCheckpoint() {
		return fmt.Errorf("%s cannot checkpoint: %w", c.name, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("creating checkpoint dir: %w", err)
	}
	args := []string{"checkpoint", "--image-path=" + imageDir}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	_, err := c.run(ctx, id, append(args, id)...)
	if err != nil && strings.Contains(err.Error(), "no space left on device") {
		err = errors.Join(err, errdefs.ErrResourceExhausted)
	}
	return err
}

// Restore creates container id from b, resumed from the image in imageDir,
// and returns once it runs (restore --detach). If container id was
// created from b already (Create, not started), runsc restores into it:
// its sandbox and gofer processes, spawned by the create, are used, and
// the stdio it was created with are the container's (io is not). An
// image mostly out of the page cache is read with O_DIRECT (see
// RestoreDirect). As with Create, the command's stderr (and the
// container's, if io.Stderr is nil) and the runtime's log go to
// b.Dir/create.log, and a failed restore is deleted.
func (c *CLI) Restore(ctx context.Context, id string, b *Bundle, imageDir string, io IO) error {
	if !c.CanCheckpoint() {
		return fmt.Errorf("%s cannot restore: %w", c.name, errdefs.ErrFailedPrecondition)
	}
	if err := checkID(id); err != nil {
		return err
	}
	c.netFlags.Delete(id) // a created container is restored, not started
	logPath := filepath.Join(b.Dir, CreateLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("opening create log: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)

	args := append(c.args(c.networkFlag(b)...), "--log="+logPath, "restore", "--detach", "--bundle="+b.Dir, "--image-path="+imageDir)
	if RestoreDirect(imageDir) {
		args = append(args, "--direct")
	}
	args = append(args, id)
	cmd := exec.CommandContext(ctx, c.binary, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = io.Stdin, io.Stdout, io.Stderr
	if io.Stdin == nil {
		cmd.Stdin = nil
	}
	if io.Stdout == nil {
		cmd.Stdout = nil
	}
	if io.Stderr == nil {
		cmd.Stderr = logf
	}
	if err := cmd.Run(); err != nil {
		msg := readFrom(logPath, start)
		cleanup := context.WithoutCancel(ctx)
		_ = c.Delete(cleanup, id, true)
		if b.Spec != nil && b.Spec.Linux != nil && b.Spec.Linux.CgroupsPath != "" {
			_ = removeCgroups(cleanup, b.Spec.Linux.CgroupsPath)
		}
		return fmt.Errorf("%s restore %s: %w: %s", c.name, id, err, lastLine(msg))
	}
	return nil
}

// lastLine keeps an error message short: the runtime's log ends with the
// reason.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

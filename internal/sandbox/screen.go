package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"regexp"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Screenshots of a sandbox's X display (GET /v1/sandboxes/{id}/screenshot
// and the computer tool): scrot, run as the sandbox's user through the
// agent's process API as E2B's desktop SDK runs it, writes the screen as
// a PNG to its stdout. What comes back is untrusted: its size and time are
// bounded and it must decode as a PNG of a sane size.
//
// scrot refuses a stdout it cannot access(2) by name, and the agent's
// pipes belong to root: so it writes into a pipe of the user's own shell
// (a fixed script; the display goes in the environment).
const scrotScript = "set -o pipefail; scrot --pointer --silent - | cat"

// DefaultDisplay is the X display of the desktop template (and of E2B's
// desktop SDK).
const DefaultDisplay = ":0"

const (
	// MaxScreenshotBytes bounds a screenshot (a 4K screen of photos is
	// about 25 MiB as PNG).
	MaxScreenshotBytes = 32 << 20
	// maxScreenSide bounds a screenshot's width and height.
	maxScreenSide = 16384
	// screenshotTimeout bounds taking one.
	screenshotTimeout = 20 * time.Second
	// maxScrotStderr is what is kept of scrot's stderr, for the error.
	maxScrotStderr = 2048
)

var displayRE = regexp.MustCompile(`^:[0-9]{1,3}(\.[0-9]{1,2})?$`)

// CheckDisplay checks an X display name of the sandbox: ":N" or ":N.S"
// (local displays only).
func CheckDisplay(d string) error {
	if !displayRE.MatchString(d) {
		return fmt.Errorf("display %q: want a local X display such as :0: %w", errdefs.ClipN(d, 20), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Screenshot is a PNG of a sandbox's screen.
type Screenshot struct {
	PNG           []byte
	Width, Height int
}

// Screenshot captures the X display (DefaultDisplay if "") as a PNG,
// with the mouse pointer. A sandbox without scrot or without an X server
// on the display is ErrFailedPrecondition saying so.
func (a *Agent) Screenshot(ctx context.Context, display string) (Screenshot, error) {
	if display == "" {
		display = DefaultDisplay
	}
	if err := CheckDisplay(display); err != nil {
		return Screenshot{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, screenshotTimeout+5*time.Second)
	defer cancel()
	var img, stderr bytes.Buffer
	exit, err := a.Exec(ctx, wire.ExecParams{
		Args: []string{"bash", "-c", scrotScript}, Env: map[string]string{"DISPLAY": display},
		Tag: "screenshot", TimeoutMs: screenshotTimeout.Milliseconds(), OutputLimit: MaxScreenshotBytes + maxScrotStderr,
	}, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			if img.Len()+len(ev.Data) > MaxScreenshotBytes {
				return fmt.Errorf("screenshot larger than %d MiB: %w", MaxScreenshotBytes>>20, errdefs.ErrResourceExhausted)
			}
			img.Write(ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data[:min(len(ev.Data), max(0, maxScrotStderr-stderr.Len()))])
		}
		return nil
	})
	switch {
	case errors.Is(err, errdefs.ErrNotFound) || (err == nil && exit.Code == 127):
		return Screenshot{}, fmt.Errorf("this sandbox has no scrot: screenshots need a desktop sandbox (template desktop): %w", errdefs.ErrFailedPrecondition)
	case err != nil:
		return Screenshot{}, fmt.Errorf("taking a screenshot: %w", err)
	case exit.Reason == api.ExitTimeout:
		return Screenshot{}, fmt.Errorf("taking a screenshot: scrot did not finish in %v: %w", screenshotTimeout, errdefs.ErrDeadlineExceeded)
	case exit.Truncated || exit.Reason == api.ExitOutputLimit:
		return Screenshot{}, fmt.Errorf("screenshot larger than %d MiB: %w", MaxScreenshotBytes>>20, errdefs.ErrResourceExhausted)
	case exit.Code != 0:
		return Screenshot{}, scrotError(display, exit, stderr.String())
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img.Bytes()))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width > maxScreenSide || cfg.Height > maxScreenSide {
		return Screenshot{}, fmt.Errorf("taking a screenshot: scrot wrote no PNG of a screen (%d bytes): %w", img.Len(), errdefs.ErrFailedPrecondition)
	}
	return Screenshot{PNG: img.Bytes(), Width: cfg.Width, Height: cfg.Height}, nil
}

// scrotError classes scrot's failure: most often there is no X server on
// the display.
func scrotError(display string, exit *api.ExitStatus, stderr string) error {
	if strings.Contains(stderr, "open X display") || strings.Contains(stderr, "Can't open display") {
		return fmt.Errorf("no X server on display %s in this sandbox: use a desktop sandbox (template desktop) whose desktop is up: %w", display, errdefs.ErrFailedPrecondition)
	}
	msg := strings.TrimSpace(strings.ToValidUTF8(stderr, "?"))
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("taking a screenshot: scrot exited with code %d: %s: %w", exit.Code, errdefs.ClipN(msg, 300), errdefs.ErrFailedPrecondition)
}

package sandbox

import (
	"context"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/template"
)

// imageHooks is the one seam through which the core reaches the
// checkpoint-image features (Images, images.go); nothing else in the core
// calls them. A create may be served from an image, and Close must stop
// the pools, whose sandboxes have no record. NewImages installs an Images;
// until then noImages answers: no snapshot can be restored, no template
// is warm, nothing is pooled.
type imageHooks interface {
	// fromSnapshot makes the sandbox of a create from a snapshot
	// (opts.Snapshot set): Create hands it such creates whole.
	fromSnapshot(ctx context.Context, opts CreateOptions) (Sandbox, error)
	// claim serves a validated create, want with network net, with a
	// ready sandbox from tmpl's pool; ok false when none fits (Create then makes one), an
	// error is a quota refusal.
	claim(ctx context.Context, want Sandbox, net *NetworkOptions, tmpl *template.Template, q Quota) (_ Sandbox, ok bool, _ error)
	// warmCheckpoint returns the warm checkpoint of tmpl that a sandbox on
	// rt with limits l can restore instead of booting, or nil and why not
	// ("" when tmpl has no warm step): Create's launch restores it.
	warmCheckpoint(tmpl *template.Template, rt oci.Runtime, l Limits) (*template.Checkpoint, string)
	// closePools stops the pools and destroys their sandboxes: Close.
	closePools()
}

var _ imageHooks = (*Images)(nil)

// noImages is the image seam of a Manager without Images.
type noImages struct{}

func (noImages) fromSnapshot(context.Context, CreateOptions) (Sandbox, error) {
	return Sandbox{}, fmt.Errorf("this server makes no sandboxes from snapshots: %w", errdefs.ErrFailedPrecondition)
}

func (noImages) claim(context.Context, Sandbox, *NetworkOptions, *template.Template, Quota) (Sandbox, bool, error) {
	return Sandbox{}, false, nil
}

func (noImages) warmCheckpoint(*template.Template, oci.Runtime, Limits) (*template.Checkpoint, string) {
	return nil, ""
}

func (noImages) closePools() {}

// setImages installs the image seam (NewImages).
func (m *Manager) setImages(h imageHooks) {
	m.mu.Lock()
	m.images = h
	m.mu.Unlock()
}

// imageSeam returns the image seam.
func (m *Manager) imageSeam() imageHooks {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.images
}

// Package image resolves the OCI image a template build starts from and
// unpacks its layers.
//
// An image comes from a registry (Pull) or from an uploaded archive, an OCI
// image layout or `docker save` tarball (Load). Either way it is the
// linux/amd64 image: an index is resolved to its linux/amd64 manifest. Its
// layers (Image.Layers) are keyed by their diffID, so a layer two images
// share is unpacked once; Layer.Unpack writes one layer into a directory in
// the overlay format the layer store and the sandbox's root filesystem use
// (whiteouts as character devices 0:0, opaque directories marked with the
// trusted.overlay.opaque xattr). Image.Config is what a template takes from
// the image's config: env, user, workdir and its start command.
//
// Errors are classified with errdefs and written for the user who named
// the image; registry credentials never appear in them.
package image

import (
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Platform is the only platform Kiln runs images for.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Image is a resolved base image.
type Image struct {
	ref    string // what the user named it by, for messages
	config Config
	layers []Layer
	close  func() error
}

// Config is what a template takes from an image's config.
type Config struct {
	// Env holds KEY=VALUE pairs in the image's order.
	Env []string
	// User is the image's USER ("" when unset: root).
	User string
	// Workdir is the image's WORKDIR ("" when unset).
	Workdir string
	// Cmd is the image's ENTRYPOINT followed by its CMD as one /bin/sh
	// command line ("" when neither is set): a shell-form command comes
	// back as written, exec-form words are single-quoted.
	Cmd string
	// Annotations are the image manifest's (Push writes them, Pull
	// reads them): Kiln's cluster registry names there the built-in
	// template build an image's layers go on (docs/cluster.md).
	Annotations map[string]string
}

// Layer is one layer of an image, bottom first in Image.Layers.
type Layer struct {
	// Key is the hex SHA-256 of the layer's uncompressed tar (its diffID):
	// the same layer in two images has the same key. Unpack checks the
	// content against it.
	Key string
	// Size is the layer's size as stored (compressed), -1 when unknown.
	Size int64

	image string // the image's reference, for messages
	l     v1.Layer
}

// Ref is the image's reference as given (an archive's name for Load).
func (i *Image) Ref() string { return i.ref }

// Config returns what a template takes from the image's config.
func (i *Image) Config() Config { return i.config }

// Layers returns the image's layers, bottom first.
func (i *Image) Layers() []Layer { return i.layers }

// Close releases what reading the image needed (the unpacked OCI layout of
// an archive). Layers cannot be unpacked after Close.
func (i *Image) Close() error {
	if i.close == nil {
		return nil
	}
	c := i.close
	i.close = nil
	return c()
}

// newImage reads img's config and layer list and checks its platform.
func newImage(ref string, img v1.Image) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: reading its config: %w", errdefs.Clip(ref), err)
	}
	if (cf.OS != "" && cf.OS != Platform.OS) || (cf.Architecture != "" && cf.Architecture != Platform.Architecture) {
		return nil, fmt.Errorf("image %s is for %s/%s, not %s: %w", errdefs.Clip(ref), cf.OS, cf.Architecture, Platform, errdefs.ErrInvalidArgument)
	}
	ls, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image %s: listing its layers: %w", errdefs.Clip(ref), err)
	}
	out := &Image{ref: ref, config: configOf(cf.Config)}
	if m, err := img.Manifest(); err == nil && len(m.Annotations) > 0 {
		out.config.Annotations = m.Annotations
	}
	for n, l := range ls {
		d, err := l.DiffID()
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", errdefs.Clip(ref), n+1, err)
		}
		if d.Algorithm != "sha256" {
			return nil, fmt.Errorf("image %s: layer %d has a %s digest; only sha256 is supported: %w", errdefs.Clip(ref), n+1, errdefs.Clip(d.Algorithm), errdefs.ErrInvalidArgument)
		}
		size, err := l.Size()
		if err != nil {
			size = -1
		}
		out.layers = append(out.layers, Layer{Key: d.Hex, Size: size, image: ref, l: l})
	}
	return out, nil
}

// configOf maps an image config onto a template's defaults.
func configOf(c v1.Config) Config {
	argv := append(append([]string(nil), c.Entrypoint...), c.Cmd...)
	return Config{
		Env:     append([]string(nil), c.Env...),
		User:    c.User,
		Workdir: c.WorkingDir,
		Cmd:     shellCommand(argv),
	}
}

// shellCommand turns an exec-form argv into one /bin/sh command line. A
// shell form (["/bin/sh", "-c", script], as Dockerfiles write CMD script)
// is the script itself.
func shellCommand(argv []string) string {
	if len(argv) == 3 && (argv[0] == "/bin/sh" || argv[0] == "sh") && argv[1] == "-c" {
		return argv[2]
	}
	words := make([]string, len(argv))
	for n, a := range argv {
		words[n] = shellQuote(a)
	}
	return strings.Join(words, " ")
}

// shellQuote quotes s as one POSIX shell word: bare when it holds only
// characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

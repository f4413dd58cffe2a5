package image

import (
	"fmt"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// maxIndexDepth bounds how deep indexes may nest.
const maxIndexDepth = 4

// fromIndex picks the linux/amd64 image of idx: the manifest whose
// platform is linux/amd64 (any variant), else the only manifest when none
// names a platform (an OCI layout's index.json of one image). Nested
// indexes are followed.
func fromIndex(ref string, idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("image %s: indexes nested more than %d deep: %w", errdefs.Clip(ref), maxIndexDepth, errdefs.ErrInvalidArgument)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image %s: reading its index: %w", errdefs.Clip(ref), err)
	}
	var pick *v1.Descriptor
	has := map[string]bool{}
	for n := range m.Manifests {
		d := &m.Manifests[n]
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		if d.Platform == nil {
			if len(m.Manifests) == 1 {
				pick = d
			}
			continue
		}
		if d.Platform.OS == Platform.OS && d.Platform.Architecture == Platform.Architecture {
			pick = d
			break
		}
		has[d.Platform.OS+"/"+d.Platform.Architecture] = true
	}
	if pick == nil {
		return nil, fmt.Errorf("image %s has no %s image (it has: %s): %w", errdefs.Clip(ref), Platform, platformList(has), errdefs.ErrInvalidArgument)
	}
	if pick.MediaType.IsIndex() {
		child, err := idx.ImageIndex(pick.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s: reading index %s: %w", errdefs.Clip(ref), pick.Digest, err)
		}
		return fromIndex(ref, child, depth+1)
	}
	img, err := idx.Image(pick.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: reading manifest %s: %w", errdefs.Clip(ref), pick.Digest, err)
	}
	return img, nil
}

// platformList names the platforms of has, sorted, for an error message.
func platformList(has map[string]bool) string {
	if len(has) == 0 {
		return "no platform images"
	}
	var l []string
	for p := range has {
		l = append(l, errdefs.ClipN(p, 40))
	}
	sort.Strings(l)
	if len(l) > 10 {
		l = append(l[:10], "…")
	}
	return strings.Join(l, ", ")
}

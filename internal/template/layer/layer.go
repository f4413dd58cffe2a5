// Package layer keeps the layers that template root filesystems are made
// of, and makes the layers of COPY/ADD steps and RUN steps.
//
// A layer is a directory in overlayfs upper-dir form (whiteouts as 0:0
// character devices, opaque directories marked with the xattr
// trusted.overlay.opaque=y), so a template's root filesystem is an overlay
// whose lowerdir is its layers, top first. A Store holds published layers
// under content keys, immutable once published; Key chains a step's key
// onto its parent's, so an unchanged recipe finds every layer again.
// Copy makes a COPY/ADD step's layer on the host from the uploaded build
// context; Capture turns a build sandbox's overlay upper dir into a layer.
package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/kiln-sh/kiln/api"
)

// keyVersion changes when the meaning of a layer changes (what Copy or
// Capture produce for the same inputs), invalidating every cached layer.
const keyVersion = "kiln-layer-v1"

// Key is the cache key of the layer that step makes on top of the layer
// parent ("" for none): the hex SHA-256 of keyVersion, parent, the step's
// Type, its Args, its FilesHash and extra (whatever else the result
// depends on, e.g. the user and environment a RUN step runs with), each
// field written as its decimal length, ':' and its bytes, so no two
// different inputs share an encoding (E2B's HashKeys joins args with a
// space: ["a b"] and ["a", "b"] collide there). Force and Line are not part
// of the key: forcing a step rebuilds it under the same key, and moving a
// line in a Dockerfile changes nothing built.
func Key(parent string, step api.TemplateStep, extra ...string) string {
	h := sha256.New()
	field := func(s string) {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	field(keyVersion)
	field(parent)
	field(step.Type)
	field(strconv.Itoa(len(step.Args)))
	for _, a := range step.Args {
		field(a)
	}
	field(step.FilesHash)
	field(strconv.Itoa(len(extra)))
	for _, e := range extra {
		field(e)
	}
	return hex.EncodeToString(h.Sum(nil))
}

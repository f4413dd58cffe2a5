package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/volume"
)

// E2B's volume API on internal/volume: /volumes (create, list, get,
// delete; the API key's) and the content API the SDK's Volume file
// methods call, /volumecontent/{volumeID}/{dir,path,file}, authorised by
// the volume's token (VolumeToken) that create and get return. The SDK
// sends content requests to E2B_VOLUME_API_URL, else to https://api.<the
// volume's domain>: point E2B_VOLUME_API_URL at kiln serve.

// VolumeToken is the content-API token of volume id: an HMAC of the id
// under the server's secret, like AccessToken.
func VolumeToken(secret []byte, id string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("volume-content-token:" + id))
	return hex.EncodeToString(m.Sum(nil))
}

var errNoVolumes = fmt.Errorf("volumes are not enabled on this server: %w", errdefs.ErrUnavailable)

func (h *Handler) registerVolumes() {
	h.route("POST /volumes", h.createVolume)
	h.route("GET /volumes", h.listVolumes)
	h.route("GET /volumes/{volumeID}", h.getVolume)
	h.route("DELETE /volumes/{volumeID}", h.deleteVolume)
	h.content("GET /volumecontent/{volumeID}/dir", h.listDir)
	h.content("POST /volumecontent/{volumeID}/dir", h.makeDir)
	h.content("GET /volumecontent/{volumeID}/path", h.statPath)
	h.content("PATCH /volumecontent/{volumeID}/path", h.setPathMeta)
	h.content("DELETE /volumecontent/{volumeID}/path", h.removePath)
	h.content("GET /volumecontent/{volumeID}/file", h.readVolumeFile)
	h.content("PUT /volumecontent/{volumeID}/file", h.writeVolumeFile)
}

// volumeJSON is E2B's Volume; volumeAndToken its VolumeAndToken.
type volumeJSON struct {
	Name     string `json:"name"`
	VolumeID string `json:"volumeID"`
}

type volumeAndToken struct {
	volumeJSON
	Token string `json:"token"`
}

// volumeMount is E2B's SandboxVolumeMount: a volume by name.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// createMounts is a create request's volumeMounts as Kiln's (read-write:
// E2B has no read-only mounts).
func createMounts(ms []volumeMount) []sandbox.VolumeMount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]sandbox.VolumeMount, len(ms))
	for i, m := range ms {
		out[i] = sandbox.VolumeMount{Volume: m.Name, Path: m.Path}
	}
	return out
}

// shownMounts is a sandbox's volumes as E2B shows them.
func shownMounts(ms []sandbox.VolumeMount) []volumeMount {
	out := make([]volumeMount, len(ms))
	for i, m := range ms {
		out[i] = volumeMount{Name: m.Volume, Path: m.Path}
	}
	return out
}

func (h *Handler) volumes() (*volume.Manager, error) {
	if h.o.Volumes == nil {
		return nil, errNoVolumes
	}
	return h.o.Volumes, nil
}

func (h *Handler) withToken(v volume.Volume) volumeAndToken {
	return volumeAndToken{volumeJSON: volumeJSON{Name: v.Name, VolumeID: v.ID}, Token: VolumeToken(h.o.Secret, v.ID)}
}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request, c Caller) error {
	vm, err := h.volumes()
	if err != nil {
		return err
	}
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	v, err := vm.Create(r.Context(), c.Owner, req.Name, 0)
	if err != nil {
		return fmt.Errorf("creating volume: %w", err)
	}
	writeJSON(w, http.StatusCreated, h.withToken(v))
	return nil
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request, c Caller) error {
	vm, err := h.volumes()
	if err != nil {
		return err
	}
	vs, err := vm.List(r.Context(), c.Owner)
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	out := make([]volumeJSON, len(vs))
	for i, v := range vs {
		out[i] = volumeJSON{Name: v.Name, VolumeID: v.ID}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request, c Caller) error {
	vm, err := h.volumes()
	if err != nil {
		return err
	}
	v, err := vm.Get(r.Context(), c.Owner, r.PathValue("volumeID"))
	if err != nil {
		return fmt.Errorf("getting volume: %w", err)
	}
	writeJSON(w, http.StatusOK, h.withToken(v))
	return nil
}

func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request, c Caller) error {
	vm, err := h.volumes()
	if err != nil {
		return err
	}
	if err := vm.Delete(r.Context(), c.Owner, r.PathValue("volumeID")); err != nil {
		return fmt.Errorf("deleting volume: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// contentFunc serves one content-API request on the volume's open
// directory; path is the query's path.
type contentFunc func(w http.ResponseWriter, r *http.Request, d *volume.Dir, path string) error

// content registers a content-API handler behind the volume's token.
func (h *Handler) content(pattern string, fn contentFunc) {
	h.control.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("volumeID")
		edge.Annotate(r, id)
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !sameToken(token, VolumeToken(h.o.Secret, id)) {
			if err := h.edge.Admit(r, false); err != nil {
				h.writeError(w, r, err)
				return
			}
			writeStatus(w, http.StatusUnauthorized, "invalid or missing volume token: GET /volumes/{volumeID} returns it")
			return
		}
		_ = h.edge.Admit(r, true) // the token is a credential: never refused
		err := func() error {
			vm, err := h.volumes()
			if err != nil {
				return err
			}
			d, err := vm.Open(r.Context(), id)
			if err != nil {
				return err
			}
			defer d.Close()
			return fn(w, r, d, r.URL.Query().Get("path"))
		}()
		if err != nil {
			h.writeError(w, r, err)
		}
	})
}

// entryJSON is the content API's VolumeEntryStat.
type entryJSON struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"`
	Target string    `json:"target,omitempty"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
}

func toEntryJSON(e volume.Entry) entryJSON { return entryJSON(e) }

// meta reads the uid, gid and mode query parameters.
func meta(r *http.Request) (volume.Meta, error) {
	var m volume.Meta
	q := r.URL.Query()
	for name, dst := range map[string]**uint32{"uid": &m.UID, "gid": &m.GID, "mode": &m.Mode} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return m, invalid("%s %q: want a non-negative integer", name, errdefs.ClipN(v, 20))
		}
		u := uint32(n)
		*dst = &u
	}
	return m, nil
}

func (h *Handler) listDir(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return invalid("depth %q: want 1-64", errdefs.ClipN(v, 20))
		}
		depth = n
	}
	es, err := d.List(p, depth)
	if err != nil {
		return err
	}
	out := make([]entryJSON, len(es))
	for i, e := range es {
		out[i] = toEntryJSON(e)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) makeDir(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	m, err := meta(r)
	if err != nil {
		return err
	}
	e, err := d.Mkdir(p, m, r.URL.Query().Get("force") == "true")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toEntryJSON(e))
	return nil
}

func (h *Handler) statPath(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	e, err := d.Stat(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryJSON(e))
	return nil
}

func (h *Handler) setPathMeta(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	var body struct {
		UID  *uint32 `json:"uid"`
		GID  *uint32 `json:"gid"`
		Mode *uint32 `json:"mode"`
	}
	if err := decodeJSON(w, r, &body); err != nil {
		return err
	}
	e, err := d.SetMeta(p, volume.Meta{UID: body.UID, GID: body.GID, Mode: body.Mode})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryJSON(e))
	return nil
}

func (h *Handler) removePath(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	if err := d.Remove(p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) readVolumeFile(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	f, err := d.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, f)
	return nil
}

func (h *Handler) writeVolumeFile(w http.ResponseWriter, r *http.Request, d *volume.Dir, p string) error {
	m, err := meta(r)
	if err != nil {
		return err
	}
	edge.StreamBody(r) // a large upload may pause: only an idle deadline
	e, err := d.WriteFile(p, r.Body, m)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toEntryJSON(e))
	return nil
}

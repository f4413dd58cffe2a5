package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Custom templates (docs/templates.md): upload the files a recipe's
// COPY/ADD steps need, start a build, follow its log, then create
// sandboxes with CreateSandboxRequest{Template: "name"}.

// templateFilesPath is /v1/templates/files/{hash}.
func templateFilesPath(hash string) string { return "/v1/templates/files/" + url.PathEscape(hash) }

// TemplateFilesExist reports whether the caller's key already uploaded the
// files named hash (a COPY/ADD step's FilesHash, or an image archive's).
func (c *Client) TemplateFilesExist(ctx context.Context, hash string) (bool, error) {
	err := c.call(ctx, http.MethodHead, templateFilesPath(hash), nil, nil, nil)
	switch {
	case err == nil:
		return true, nil
	case IsCode(err, api.CodeNotFound):
		return false, nil
	}
	return false, err
}

// UploadTemplateFiles uploads tarball (a tar, optionally gzipped, of a
// COPY/ADD step's sources; or an OCI layout or `docker save` tarball for
// TemplateBase.Archive) under hash, for the caller's builds to use. An
// upload over the server's context limit fails with resource_exhausted
// (413).
func (c *Client) UploadTemplateFiles(ctx context.Context, hash string, tarball io.Reader) error {
	resp, err := c.send(ctx, request{method: http.MethodPut, path: templateFilesPath(hash), body: tarball, ctype: "application/x-tar"})
	if err != nil {
		return err
	}
	drain(resp.Body)
	return nil
}

// StartTemplateBuild starts a build of req.Template from req.Spec and
// returns at once with its record (status building). Follow it with
// TemplateBuildLogs or WaitTemplateBuild. Too many builds of the key, or
// of the server, running at once fail with resource_exhausted (429).
func (c *Client) StartTemplateBuild(ctx context.Context, req api.TemplateBuildRequest) (*api.TemplateBuild, error) {
	var b api.TemplateBuild
	if err := c.call(ctx, http.MethodPost, "/v1/templates/builds", nil, req, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// TemplateBuild returns a build's record: its status, and why it failed.
func (c *Client) TemplateBuild(ctx context.Context, id string) (*api.TemplateBuild, error) {
	var b api.TemplateBuild
	if err := c.call(ctx, http.MethodGet, "/v1/templates/builds/"+url.PathEscape(id), nil, nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// TemplateBuilds lists the caller's builds of template name ("": of every
// template), newest first, at most limit (0: the server's default).
func (c *Client) TemplateBuilds(ctx context.Context, name string, limit int) ([]api.TemplateBuild, error) {
	q := url.Values{}
	if name != "" {
		q.Set("template", name)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l api.TemplateBuildList
	if err := c.call(ctx, http.MethodGet, "/v1/templates/builds", q, nil, &l); err != nil {
		return nil, err
	}
	return l.Builds, nil
}

// TemplateBuildLogs calls fn with a build's log entries from entry offset
// on. With follow it keeps reading until the build ends, else it stops at
// the end of what the log has so far. fn returning an error ends the
// stream with that error.
func (c *Client) TemplateBuildLogs(ctx context.Context, id string, offset int, follow bool, fn func(api.TemplateLogEntry) error) error {
	q := url.Values{"offset": {strconv.Itoa(offset)}, "follow": {strconv.FormatBool(follow)}}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/templates/builds/" + url.PathEscape(id) + "/logs", query: q, accept: ndjson})
	if err != nil {
		return err
	}
	defer drain(resp.Body)
	return readLogEntries(ctx, resp.Body, fn)
}

// logLine is a line of a build log stream: an entry, or an event of the
// stream itself (a ping, or the error that ended it).
type logLine struct {
	api.TemplateLogEntry
	Type  api.EventType `json:"type"`
	Error *api.Error    `json:"error"`
}

// readLogEntries reads an NDJSON build log stream to its end.
func readLogEntries(ctx context.Context, body io.Reader, fn func(api.TemplateLogEntry) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxEventSize)
	sc.Split(splitLines)
	for n := 0; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("decoding build log line %d: %w", n+1, err)
		}
		switch l.Type {
		case api.EventPing:
			continue
		case api.EventError:
			return streamError(api.Event{Error: l.Error}, "build log stream ended with an error")
		}
		if err := fn(l.TemplateLogEntry); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("reading build log: a line is longer than %d bytes", MaxEventSize)
		}
		return fmt.Errorf("reading build log: %w", err)
	}
	return nil
}

// WaitTemplateBuild follows a build's log until the build ends, then
// returns its final record (status ready or error; Reason says why it
// failed). A build that failed is not an error of WaitTemplateBuild.
func (c *Client) WaitTemplateBuild(ctx context.Context, id string) (*api.TemplateBuild, error) {
	for followed := false; ; followed = true {
		b, err := c.TemplateBuild(ctx, id)
		if err != nil {
			return nil, err
		}
		if b.Status == api.BuildReady || b.Status == api.BuildError {
			return b, nil
		}
		if followed { // the log ended (or dropped) before the record did: do not spin
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		// Following ends when the build does (or the connection drops:
		// then look again).
		err = c.TemplateBuildLogs(ctx, id, 0, true, func(api.TemplateLogEntry) error { return nil })
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Code != api.CodeUnavailable {
			return nil, err
		}
	}
}

// ListTemplates lists the templates the caller can use: its own (an admin
// key: everyone's), the public ones and the built-ins, one per tag.
func (c *Client) ListTemplates(ctx context.Context) ([]api.Template, error) {
	var l api.TemplateList
	if err := c.call(ctx, http.MethodGet, "/v1/templates", nil, nil, &l); err != nil {
		return nil, err
	}
	return l.Templates, nil
}

// templatePath is /v1/templates/{ref} followed by elem.
func templatePath(ref string, elem ...string) string {
	p := "/v1/templates/" + url.PathEscape(ref)
	for _, e := range elem {
		p += "/" + url.PathEscape(e)
	}
	return p
}

// GetTemplate returns the template ref ("name" or "name:tag") means to the
// caller, with its current build.
func (c *Client) GetTemplate(ctx context.Context, ref string) (*api.Template, error) {
	var t api.Template
	if err := c.call(ctx, http.MethodGet, templatePath(ref), nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate removes a tag ("name:tag"), or every tag of a template (a
// bare "name"). Running sandboxes keep their build.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, templatePath(ref), nil, nil, nil)
}

// TagTemplate points name:tag at one of the template's ready builds.
func (c *Client) TagTemplate(ctx context.Context, name, tag, buildID string) (*api.Template, error) {
	var t api.Template
	if err := c.call(ctx, http.MethodPut, templatePath(name, "tags", tag), nil, api.TemplateTagRequest{BuildID: buildID}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// UntagTemplate removes name:tag.
func (c *Client) UntagTemplate(ctx context.Context, name, tag string) error {
	return c.call(ctx, http.MethodDelete, templatePath(name, "tags", tag), nil, nil, nil)
}

// SetTemplatePublic makes every tag of the caller's template name usable by
// every key (public) or by its owner only.
func (c *Client) SetTemplatePublic(ctx context.Context, name string, public bool) (*api.Template, error) {
	var t api.Template
	if err := c.call(ctx, http.MethodPatch, templatePath(name), nil, api.TemplateUpdate{Public: &public}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// PushTemplate pushes the build ref ("name" or "name:tag") means to the
// caller to a registry as an OCI image (req.Image); it returns when the
// push is done.
func (c *Client) PushTemplate(ctx context.Context, ref string, req api.TemplatePushRequest) (*api.TemplatePushResult, error) {
	var out api.TemplatePushResult
	if err := c.call(ctx, http.MethodPost, templatePath(ref, "push"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

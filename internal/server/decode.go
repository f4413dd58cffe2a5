package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// maxJSONBytes bounds JSON request bodies.
const maxJSONBytes = 1 << 20

// maxPathBytes bounds paths inside a sandbox (Linux's PATH_MAX).
const maxPathBytes = 4096

// decodeJSON decodes one JSON value from r's body into v, refusing
// unknown fields, trailing data and bodies over maxJSONBytes. The
// Content-Type is not checked: `curl -d` sends a form type with JSON.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeBody(http.MaxBytesReader(w, r.Body, maxJSONBytes), v)
}

// decodeBody decodes exactly one JSON value from body.
func decodeBody(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return err
		}
		if bt, ok := errors.AsType[*edge.BodyTimeoutError](err); ok {
			return bt
		}
		if errors.Is(err, io.EOF) {
			return invalid("empty request body: want a JSON object")
		}
		return invalid("malformed JSON body: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return err
		}
		if bt, ok := errors.AsType[*edge.BodyTimeoutError](err); ok {
			return bt
		}
		return invalid("malformed JSON body: data after the JSON object")
	}
	return nil
}

// jsonProblem says what is wrong with a body without echoing much of it.
func jsonProblem(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("field %q: want %s", te.Field, te.Type)
	}
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return strings.TrimPrefix(msg, "json: ")
}

// checkQuery refuses query parameters not in allowed (typos would
// otherwise be silently ignored) and repeated single-valued ones. An
// allowed name ending in "*" may repeat; one ending in "." is a prefix
// (metadata.KEY).
func checkQuery(q url.Values, allowed ...string) error {
	for k, vs := range q {
		spec, ok := querySpec(allowed, k)
		if !ok {
			return invalid("unknown query parameter %q (allowed: %s)", errdefs.ClipN(k, 64), strings.Join(allowed, ", "))
		}
		if len(vs) > 1 && !strings.HasSuffix(spec, "*") {
			return invalid("query parameter %q given %d times", errdefs.ClipN(k, 64), len(vs))
		}
	}
	return nil
}

func querySpec(allowed []string, k string) (string, bool) {
	for _, a := range allowed {
		name := strings.TrimSuffix(a, "*")
		if k == name || (strings.HasSuffix(name, ".") && len(k) > len(name) && strings.HasPrefix(k, name)) {
			return a, true
		}
	}
	return "", false
}

// intParam parses an optional integer query parameter within [lo, hi].
func intParam(q url.Values, name string, def, lo, hi int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, invalid("%s %q: want an integer in [%d, %d]", name, errdefs.ClipN(v, 32), lo, hi)
	}
	return n, nil
}

// boolParam parses an optional boolean query parameter.
func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid("%s %q: want true or false", name, errdefs.ClipN(v, 32))
	}
	return b, nil
}

// checkUser validates a user name; "" is the default user.
func checkUser(u string) (string, error) {
	switch u {
	case "":
		return wire.UserDefault, nil
	case wire.UserDefault, wire.UserRoot:
		return u, nil
	}
	return "", invalid("user %q: want %q or %q", errdefs.ClipN(u, 32), wire.UserDefault, wire.UserRoot)
}

// checkPath validates a path inside a sandbox. Any path is allowed (the
// sandbox is the boundary, and the agent applies the user's permissions),
// but it must be present, sane in size and free of NUL bytes.
func checkPath(what, p string) error {
	switch {
	case p == "":
		return invalid("%s is required", what)
	case len(p) > maxPathBytes:
		return invalid("%s longer than %d bytes", what, maxPathBytes)
	case strings.ContainsRune(p, 0):
		return invalid("%s contains a NUL byte", what)
	}
	return nil
}

// pathParams reads ?path=P&user=U.
func pathParams(q url.Values) (wire.PathParams, error) {
	p := wire.PathParams{Path: q.Get("path")}
	if err := checkPath("path", p.Path); err != nil {
		return p, err
	}
	var err error
	p.User, err = checkUser(q.Get("user"))
	return p, err
}

// pidParam parses the {pid} path segment.
func pidParam(r *http.Request) (int, error) {
	s := r.PathValue("pid")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 || pid > 1<<22 {
		return 0, invalid("pid %q: want a positive process id", errdefs.ClipN(s, 32))
	}
	return pid, nil
}

package e2b

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/kiln-sh/kiln/api"
)

// resultFields maps the MIME types of a result to the fields of E2B's
// result line, in E2B's order; JSON-valued ones are sent as JSON, not as
// strings. Any other MIME type goes into the nested "extra" object.
var resultFields = []struct {
	mime, field string
	isJSON      bool
}{
	{"text/plain", "text", false},
	{"text/html", "html", false},
	{"text/markdown", "markdown", false},
	{"image/svg+xml", "svg", false},
	{"image/png", "png", false},
	{"image/jpeg", "jpeg", false},
	{"application/pdf", "pdf", false},
	{"text/latex", "latex", false},
	{"application/json", "json", true},
	{"application/javascript", "javascript", false},
	{"e2b/data", "data", true},
	{"e2b/chart", "chart", true},
}

// field is one member of an object that keeps its order when encoded.
type field struct {
	key   string
	value any
}

type object []field

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := marshal(f.key)
		v, err := marshal(f.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping (E2B's lines carry
// HTML as is) and without the trailing newline.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// resultLine is the "result" line of one rich output.
func resultLine(r api.Result) object {
	line := object{{"type", "result"}}
	known := map[string]bool{}
	for _, f := range resultFields {
		v, ok := r.Data[f.mime]
		if !ok {
			continue
		}
		known[f.mime] = true
		switch {
		case f.isJSON:
			line = append(line, field{f.field, jsonValue(v)})
		case f.mime == "text/plain":
			line = append(line, field{f.field, unquote(v)})
		default:
			line = append(line, field{f.field, v})
		}
	}
	var extra object
	for _, mime := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.Data {
			if !known[k] && !yield(k) {
				return
			}
		}
	}) {
		v := r.Data[mime]
		if strings.HasSuffix(mime, "json") {
			extra = append(extra, field{mime, jsonValue(v)})
		} else {
			extra = append(extra, field{mime, v})
		}
	}
	if len(extra) > 0 {
		line = append(line, field{"extra", extra})
	}
	return append(line, field{"is_main_result", r.IsMainResult})
}

// jsonValue is s as JSON if it is JSON, else the string itself.
func jsonValue(s string) any {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return s
}

// unquote strips the quotes of a Python or JavaScript string's repr, as
// E2B's server does for text/plain.
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

package e2b

import (
	"testing"

	"github.com/kiln-sh/kiln/api"
)

func TestResultLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   api.Result
		want string
	}{
		{"quoted text, main", api.Result{Data: map[string]string{"text/plain": "'hi'"}, IsMainResult: true},
			`{"type":"result","text":"hi","is_main_result":true}`},
		{"unbalanced quotes stay", api.Result{Data: map[string]string{"text/plain": `"a'`}},
			`{"type":"result","text":"\"a'","is_main_result":false}`},
		{"json as an object, png as is", api.Result{Data: map[string]string{"application/json": `{"a":1}`, "image/png": "iVBO"}},
			`{"type":"result","png":"iVBO","json":{"a":1},"is_main_result":false}`},
		{"data and chart", api.Result{Data: map[string]string{"e2b/data": `{"a":[1]}`, "e2b/chart": `{}`}},
			`{"type":"result","data":{"a":[1]},"chart":{},"is_main_result":false}`},
		{"other types nested in extra", api.Result{Data: map[string]string{"text/html": "<b>", "application/vnd.x+json": `[1]`, "text/x-y": "z"}},
			`{"type":"result","html":"<b>","extra":{"application/vnd.x+json":[1],"text/x-y":"z"},"is_main_result":false}`},
		{"invalid JSON stays a string", api.Result{Data: map[string]string{"application/json": `{`}},
			`{"type":"result","json":"{","is_main_result":false}`},
	} {
		got, err := marshal(resultLine(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s (%v), want %s", tc.name, got, err, tc.want)
		}
	}
}

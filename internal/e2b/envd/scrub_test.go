package envd_test

import (
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
)

// internalMessage is the edge's message for an unclassified error.
var internalMessage = regexp.MustCompile(`^internal error; the server log has details under request id ([0-9a-f]{16})$`)

// TestInternalErrorScrubbed: an error Kiln does not classify reaches an
// envd client as the edge's generic message with the request id, as on
// the native API, and the log holds the real error under that id. The
// error here is the kernel's ELOOP for a script that is its own
// interpreter, which the agent passes on unclassified.
func TestInternalErrorScrubbed(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	e.sh(t, "root", `printf '#!/tmp/loop\n' >/tmp/loop && chmod 755 /tmp/loop`)
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			s, err := e.process("", c.opts).Start(ctxTimeout(t, time.Minute),
				connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/tmp/loop"}}))
			if err == nil {
				_, err = collect(s, nil)
			}
			wantCode(t, err, connect.CodeInternal)
			var ce *connect.Error
			if !errors.As(err, &ce) {
				t.Fatalf("%v is not a Connect error", err)
			}
			m := internalMessage.FindStringSubmatch(ce.Message())
			if m == nil {
				t.Fatalf("message %q, want the generic one with a request id", ce.Message())
			}
			if rec := loggedInternal(t, e, m[1]); !strings.Contains(rec, "/tmp/loop") {
				t.Errorf("the log's internal error under request %s, %q, does not hold the real error", m[1], rec)
			}
		})
	}
}

// loggedInternal returns the err of the "internal error" the log holds
// for request id, failing the test if there is none.
func loggedInternal(t *testing.T, e *env, id string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(e.logs.String()))
	for {
		var rec struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
			Err       string `json:"err"`
		}
		if err := dec.Decode(&rec); errors.Is(err, io.EOF) {
			t.Fatalf("no internal error logged for request %s:\n%s", id, e.logs.String())
		} else if err != nil {
			t.Fatal(err)
		}
		if rec.Msg == "internal error" && rec.RequestID == id {
			return rec.Err
		}
	}
}

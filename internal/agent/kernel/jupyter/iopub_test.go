package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// A `1+1` does not wake the kernel's IOPub thread at all
// (python_startup.py): a flush of stdout/stderr with nothing unsent does
// not wake it (_kiln_fast_flush), status busy and execute_input are not
// published (_kiln_quiet_iopub), and the result and the status idle are
// sent by the main thread itself (_kiln_direct_iopub). Stock ipykernel 6
// woke it 27 times around a `1+1`; under gVisor each wake-up is dear.
func TestPythonIOPubWakeups(t *testing.T) {
	k := startPython(t)
	for range 3 {
		if o := run(t, k, "import sys; _kiln_c0 = dict(sys.stdout.pub_thread._kiln_counts)", nil, 0); o.err != nil || len(o.errs) > 0 {
			t.Fatalf("counting: %v %v", o.err, o.errs)
		}
		if o := run(t, k, "1+1", nil, 0); o.main() != "2" {
			t.Fatalf("1+1: %+v", o)
		}
		// The counts read here also have the counting cell's idle: the
		// result and two idles went direct.
		o := run(t, k, `_kiln_c1 = sys.stdout.pub_thread._kiln_counts
print(_kiln_c1["queued"] - _kiln_c0["queued"], _kiln_c1["direct"] - _kiln_c0["direct"])`, nil, 0)
		var queued, direct int
		if _, err := fmt.Sscan(o.stdout, &queued, &direct); err != nil {
			t.Fatalf("counts: %q %v %v", o.stdout, o.err, err)
		}
		if queued != 0 || direct != 3 {
			t.Errorf("1+1 queued %d events for the IOPub thread and sent %d messages direct (with the idle of the cell before it), want 0 and 3", queued, direct)
		}
	}
}

// With IOPub messages sent by whichever thread makes them, a cell's
// events still arrive in the order the cell made them: stream text
// before a display that follows it, a display from a thread, text
// printed by a thread while the main thread displays.
func TestPythonEventOrder(t *testing.T) {
	k := startPython(t)
	tests := []struct {
		name, code string
		want       []string
	}{
		{"print, display, print", "from IPython.display import display\nprint('a')\ndisplay('b')\nprint('c', end='')\n'd'",
			[]string{"stdout a\n", "result 'b'", "stdout c", "result 'd'"}},
		{"display from a thread", "import threading\nfrom IPython.display import display\n" +
			"t = threading.Thread(target=lambda: (print('t'), display('u')))\nt.start(); t.join()\nprint('v')",
			[]string{"stdout t\n", "result 'u'", "stdout v\n"}},
		{"stderr, then a result", "import sys\nsys.stderr.write('e')\n42", []string{"stderr e", "result 42"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 5 {
				var got []string
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				_, err := k.Execute(ctx, tt.code, nil, func(ev api.Event) error {
					switch ev.Type {
					case api.EventStdout, api.EventStderr:
						// Text may come in pieces: join a piece to the one before it.
						if n := len(got); n > 0 && strings.HasPrefix(got[n-1], string(ev.Type)+" ") {
							got[n-1] += string(ev.Data)
							return nil
						}
						got = append(got, string(ev.Type)+" "+string(ev.Data))
					case api.EventResult:
						got = append(got, "result "+ev.Result.Data["text/plain"])
					}
					return nil
				})
				cancel()
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("events %q (err %v), want %q", got, err, tt.want)
				}
			}
		})
	}
}

// Whatever the fast flush skips, output still arrives whole and in order
// before the execution ends: text without a newline at the end of the
// cell, stdout and stderr interleaved, a thread's output, and output that
// the 0.2 s background flush is taking while the cell ends.
func TestPythonOutputBeforeIdle(t *testing.T) {
	k := startPython(t)
	tests := []struct {
		name, code     string
		stdout, stderr string
	}{
		{"no newline", "print('a')\nprint('b', end='')", "a\nb", ""},
		{"both streams", "import sys\nprint('o1')\nprint('e1', file=sys.stderr)\nprint('o2')\nsys.stderr.write('e2')", "o1\no2\n", "e1\ne2"},
		{"thread", "import threading\nt = threading.Thread(target=lambda: print('from thread'))\nt.start(); t.join()", "from thread\n", ""},
		{"around the flush interval", "import time\nfor i in range(4):\n    print(i)\n    time.sleep(0.19)\nprint('end', end='')", "0\n1\n2\n3\nend", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 5 {
				o := run(t, k, tt.code, nil, 0)
				if o.err != nil || o.stdout != tt.stdout || o.stderr != tt.stderr {
					t.Fatalf("stdout %q stderr %q err %v, want %q %q", o.stdout, o.stderr, o.err, tt.stdout, tt.stderr)
				}
			}
		})
	}
}

// The status idle that ends an execution carries what the agent reads of
// its execute_reply (_kiln_reply_in_idle), the same as the reply that
// still follows, so the agent ends on the idle; for a result, an
// exception, and an execution that only the reply says failed.
func TestPythonReplyInIdle(t *testing.T) {
	k := startPython(t)
	in := k.cur
	tests := []struct{ name, code, status string }{
		{"result", "1+1", "ok"},
		{"exception", "1/0", "error"},
		{"print", "print('x')", "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := in.send(in.shell, "execute_request", executeRequest{Code: tt.code, StoreHistory: true, UserExpressions: map[string]any{}})
			if err != nil {
				t.Fatal(err)
			}
			var inIdle, reply json.RawMessage
			timeout := time.After(30 * time.Second)
			for inIdle == nil || reply == nil {
				select {
				case m := <-in.msgs:
					if m.Parent.MsgID != id {
						continue
					}
					switch r := replyContent(m); {
					case r == nil:
					case m.Header.MsgType == "execute_reply":
						reply = r
					default:
						inIdle = r
					}
				case <-timeout:
					t.Fatalf("no idle with a reply (%s) or no reply (%s)", inIdle, reply)
				}
			}
			var a, b executeReply
			if err := json.Unmarshal(inIdle, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(reply, &b); err != nil {
				t.Fatal(err)
			}
			if a.Status != tt.status || a.Status != b.Status || a.ExecutionCount != b.ExecutionCount || a.EName != b.EName || a.ExecutionCount == 0 {
				t.Errorf("reply in the idle %+v, the reply %+v, want status %s", a, b, tt.status)
			}
		})
	}
	// Through Execute: the count and the error come from the idle.
	if o := run(t, k, "1/0", nil, 0); len(o.errs) != 1 || o.errs[0].Name != "ZeroDivisionError" || o.count == 0 {
		t.Fatalf("1/0: %+v", o)
	}
}

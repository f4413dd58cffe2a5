package jupyter

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// benchPython starts a Python kernel for a benchmark and runs setup in
// it.
func benchPython(b *testing.B, setup string) *Kernel {
	b.Helper()
	if exec.Command(testPython, "-c", "import ipykernel").Run() != nil {
		b.Skip("no ipykernel")
	}
	o := kernel.Options{Cwd: b.TempDir(), Env: []string{"PATH=/usr/bin:/bin", "HOME=" + b.TempDir()},
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	k, err := Start(context.Background(), PythonSpec(testPython), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { k.Close() })
	if setup != "" {
		if _, err := k.Execute(context.Background(), setup, nil, func(api.Event) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	return k
}

// BenchmarkPythonRoundTrip times a warm `1+1`, in a fresh kernel and in
// one that has imported what the code-interpreter template's warm step
// imports (matplotlib's inline backend then runs its hooks around every
// cell).
func BenchmarkPythonRoundTrip(b *testing.B) {
	for _, bb := range []struct{ name, setup string }{
		{"fresh", ""},
		{"pandas", "import pandas, matplotlib.pyplot"},
	} {
		b.Run(bb.name, func(b *testing.B) {
			k := benchPython(b, bb.setup)
			for b.Loop() {
				if _, err := k.Execute(context.Background(), "1+1", nil, func(api.Event) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPythonPhases splits a warm `1+1` into the phases of its path
// through the kernel, by the kernel's own clock (each message header's
// date; the reply's metadata "started", when the kernel began handling
// the request) and the times the agent decoded the messages, and reports
// each phase's median:
//
//	send→started         the request reaching ipykernel's main thread
//	started→result       running the cell up to its execute_result
//	result→reply         IPython's work after the result, up to the reply
//	reply→idle           up to the status idle
//	X-sent→decoded       a message from its creation in the kernel to the
//	                     agent (libzmq's I/O thread, IOPub's thread, the
//	                     sockets, zmq4)
//	total                the request until the agent can end the
//	                     execution (the idle, when it carries the reply)
//
// Inside gVisor is where it matters: build the test binary static
// (CGO_ENABLED=0 go test -c) and run it in a code-interpreter sandbox
// (kiln run --template code-interpreter ./jupyter.test -test.bench Phases
// -test.run '^$').
func BenchmarkPythonPhases(b *testing.B) {
	in := benchPython(b, "").cur
	at := func(s string) time.Time {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			b.Fatalf("kernel time %q: %v", s, err)
		}
		return t
	}
	names := []string{"send→started", "started→result", "result→reply", "reply→idle",
		"result-sent→decoded", "reply-sent→decoded", "idle-sent→decoded", "total"}
	phases := make([][]time.Duration, len(names))
	for b.Loop() {
		start := time.Now()
		id, err := in.send(in.shell, "execute_request", executeRequest{Code: "1+1", StoreHistory: true, UserExpressions: map[string]any{}})
		if err != nil {
			b.Fatal(err)
		}
		var result, reply, idle message
		for idle.Received.IsZero() || reply.Received.IsZero() {
			m := <-in.msgs
			if m.Parent.MsgID != id {
				continue
			}
			switch ev, _, isIdle := translate(m); {
			case m.Header.MsgType == "execute_reply":
				reply = m
			case isIdle:
				idle = m
			case ev != nil:
				result = m
			}
		}
		// The agent ends an execution on the later of the idle and the
		// reply, or on the idle alone when it carries the reply.
		end := reply.Received
		if replyContent(idle) != nil || idle.Received.After(end) {
			end = idle.Received
		}
		if result.Received.IsZero() {
			b.Fatal("no execute_result")
		}
		var md struct {
			Started string `json:"started"`
		}
		if err := json.Unmarshal(reply.Metadata, &md); err != nil {
			b.Fatalf("reply metadata: %v", err)
		}
		started, sent := at(md.Started), func(m message) time.Time { return at(m.Header.Date) }
		for i, d := range []time.Duration{started.Sub(start), sent(result).Sub(started), sent(reply).Sub(sent(result)),
			sent(idle).Sub(sent(reply)), result.Received.Sub(sent(result)), reply.Received.Sub(sent(reply)),
			idle.Received.Sub(sent(idle)), end.Sub(start)} {
			phases[i] = append(phases[i], d)
		}
	}
	for i, name := range names {
		slices.Sort(phases[i])
		b.ReportMetric(float64(phases[i][len(phases[i])/2])/1e6, name+"-ms")
	}
}

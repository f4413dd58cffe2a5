package jupyter

import (
	"strconv"
	"strings"
	"testing"
)

// A `1+1` wakes the kernel's IOPub thread only for the two messages the
// agent reads, its result and the status idle (python_startup.py): a
// flush of stdout/stderr with nothing unsent does not wake it
// (_kiln_fast_flush), status busy and execute_input are not published
// (_kiln_quiet_iopub). Stock ipykernel 6 woke it 27 times around a
// `1+1`; under gVisor each wake-up is dear.
func TestPythonIOPubWakeups(t *testing.T) {
	k := startPython(t)
	if o := run(t, k, `import sys
_kiln_n = [0]
def _kiln_count(f, orig=sys.stdout.pub_thread.schedule):
    _kiln_n[0] += 1
    return orig(f)
sys.stdout.pub_thread.schedule = _kiln_count`, nil, 0); o.err != nil || len(o.errs) > 0 {
		t.Fatalf("counting: %v %v", o.err, o.errs)
	}
	for range 3 {
		if o := run(t, k, "_kiln_n[0] = 0", nil, 0); o.err != nil {
			t.Fatal(o.err)
		}
		if o := run(t, k, "1+1", nil, 0); o.main() != "2" {
			t.Fatalf("1+1: %+v", o)
		}
		// The count read here also has the resetting cell's idle:
		// 2 + 1 (stock ipykernel: 27).
		o := run(t, k, "print(_kiln_n[0])", nil, 0)
		n, err := strconv.Atoi(strings.TrimSpace(o.stdout))
		if err != nil {
			t.Fatalf("count: %q %v", o.stdout, o.err)
		}
		if n > 3 {
			t.Errorf("1+1 woke the IOPub thread %d times (counted with the idle of the cell before it), want at most 3", n)
		}
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

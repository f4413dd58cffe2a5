package repl

import (
	"testing"
	"time"
)

func TestBash(t *testing.T) {
	k := start(t, NewBash, "bash")
	check(t, k, []cell{
		{name: "state", code: "cd /tmp && x=5 && f() { echo \"f:$1\"; }", stdout: ""},
		{name: "state persists", code: "pwd; echo $x; f hi", stdout: "/tmp\n5\nf:hi\n"},
		{name: "declare persists", code: "declare -A m=([k]=v); alias hi='echo alias'", stdout: ""},
		{name: "declare and alias", code: "echo ${m[k]}; hi", stdout: "v\nalias\n"},
		{name: "false", code: "false", errName: "ExitError", errValue: "exit status 1"},
		{name: "last status", code: "echo ok; (exit 7)", stdout: "ok\n", errName: "ExitError", errValue: "exit status 7"},
		{name: "stderr", code: "echo err >&2", stderr: "err\n"},
		{name: "quotes and heredoc", code: "cat <<'EOF'\na'b \"c\" $x\nEOF\necho \"it's $x\"", stdout: "a'b \"c\" $x\nit's 5\n"},
		{name: "unicode", code: "echo 'héllo ✓ 日本'", stdout: "héllo ✓ 日本\n"},
		{name: "stdin is empty", code: "cat; echo done", stdout: "done\n"},
		{name: "interrupt sleep", code: "sleep 100; echo after", timeout: 300 * time.Millisecond,
			stdout: "", errName: "Interrupted", ctxErr: true},
		{name: "interrupt builtin loop", code: "while true; do :; done", timeout: 300 * time.Millisecond,
			errName: "Interrupted", ctxErr: true},
		{name: "state survives", code: "echo $x; pwd", stdout: "5\n/tmp\n"},
		{name: "env for one cell", code: "echo $KILN_T; sh -c 'echo $KILN_T'", env: map[string]string{"KILN_T": "a b'c"}, stdout: "a b'c\na b'c\n"},
		{name: "env restored", code: "echo ${KILN_T-unset}", stdout: "unset\n"},
		{name: "exit", code: "echo bye; exit 3", stdout: "bye\n", errName: "ExitError", errValue: "exit status 3"},
		{name: "fresh shell", code: "echo \"[$x]\"", stdout: "[]\n"},
	})
}

func TestBashLargeOutput(t *testing.T) {
	k := start(t, NewBash, "bash")
	bigOutput(t, k, "head -c 20000000 /dev/zero | tr '\\0' x", 20000000)
	check(t, k, []cell{{name: "still usable", code: "echo ok", stdout: "ok\n"}})
}

func TestBashStreamsLive(t *testing.T) {
	k := start(t, NewBash, "bash")
	o := execute(t, k, "for i in 0 1 2; do echo $i; sleep 0.3; done", nil, 0)
	if o.stdout != "0\n1\n2\n" {
		t.Fatalf("stdout = %q", o.stdout)
	}
	if o.firstOut > 500*time.Millisecond || o.elapsed < 800*time.Millisecond {
		t.Errorf("first output after %v of %v: not live", o.firstOut, o.elapsed)
	}
}

func TestBashInterrupt(t *testing.T) {
	k := start(t, NewBash, "bash")
	go func() {
		time.Sleep(300 * time.Millisecond)
		k.Interrupt(t.Context())
	}()
	o := execute(t, k, "y=1; sleep 100", nil, 0)
	if o.err == nil || o.err.Name != "Interrupted" || o.elapsed > 5*time.Second {
		t.Fatalf("error %+v after %v", o.err, o.elapsed)
	}
	check(t, k, []cell{{name: "state survives", code: "echo $y", stdout: "1\n"}})
}

package repl

import (
	"testing"
	"time"
)

func TestNode(t *testing.T) {
	k := start(t, NewNode, "node")
	if k.Language() != "javascript" {
		t.Errorf("Language() = %q", k.Language())
	}
	check(t, k, []cell{
		{name: "let", code: "let x = 41"},
		{name: "let persists", code: "x + 1", result: "42"},
		{name: "function and class", code: "function f(a) { return a * 2 }\nclass C { v() { return 7 } }\nconst k = 3"},
		{name: "they persist", code: "f(2) + new C().v() + k", result: "14"},
		{name: "top-level await", code: "await new Promise(r => setTimeout(() => r(5), 10))", result: "5"},
		{name: "await with declarations", code: "const y = await Promise.resolve(3)\nlet [a, b] = [1, 2]\nfunction g() { return y + a + b }\nclass D {}\ny * x", result: "123"},
		{name: "await declarations persist", code: "[y, a, b, g(), typeof D]", result: "[ 3, 1, 2, 6, 'function' ]"},
		{name: "console order", code: "console.log('a'); console.error('b'); console.log('c'); 'done'",
			stdout: "a\nc\n", stderr: "b\n", result: "'done'"},
		{name: "TypeError", code: "let n = null\nn.foo", errName: "TypeError", errValue: "Cannot read properties of null", traceback: "at cell["},
		{name: "thrown RangeError", code: "throw new RangeError('bad')", errName: "RangeError", errValue: "bad", traceback: "RangeError: bad"},
		{name: "syntax error", code: "let = = 1", errName: "SyntaxError"},
		{name: "throw a value", code: "throw 5", errName: "Uncaught", errValue: "5"},
		{name: "interrupt a busy loop", code: "x = 50; while (true) {}", timeout: 300 * time.Millisecond,
			errName: "Interrupted", ctxErr: true},
		{name: "state survives", code: "x", result: "50"},
		{name: "interrupt an await", code: "await new Promise(r => setTimeout(r, 100000))", timeout: 300 * time.Millisecond,
			errName: "Interrupted", ctxErr: true},
		{name: "unicode", code: "console.log('héllo ✓ 日本'); 'ünï'", stdout: "héllo ✓ 日本\n", result: "'ünï'"},
		{name: "object", code: "({a: 1, b: [1, 2]})", result: "{ a: 1, b: [ 1, 2 ] }"},
		{name: "env for one cell", code: "process.env.KILN_T", env: map[string]string{"KILN_T": "v"}, result: "'v'"},
		{name: "env restored", code: "process.env.KILN_T"},
		{name: "require", code: "require('path').join('a', 'b')", result: "'a/b'"},
		{name: "exit", code: "console.log('bye'); process.exit(4)", stdout: "bye\n", errName: "ExitError", errValue: "exit status 4"},
		{name: "fresh interpreter", code: "typeof x", result: "'undefined'"},
	})
}

// Cells accept ES-module import declarations, as E2B's JavaScript kernel
// does: default, namespace, named (with renames), side-effect only, over
// several lines; what they import stays defined in later cells.
func TestNodeImports(t *testing.T) {
	k := start(t, NewNode, "node")
	check(t, k, []cell{
		{name: "default", code: "import fs from 'fs'\ntypeof fs.readFileSync", result: "'function'"},
		{name: "persists", code: "typeof fs.existsSync", result: "'function'"},
		{name: "named with rename, node: scheme", code: "import { join, basename as base } from \"node:path\";\nbase(join('a', 'b.txt'))", result: "'b.txt'"},
		{name: "namespace and default", code: "import os, * as osNS from 'os'\nos === osNS.default && typeof osNS.platform", result: "'function'"},
		{name: "over lines, then code", code: "import {\n  createHash,\n} from 'crypto'\nconst h = createHash('sha1').update('x').digest('hex').slice(0, 6)\nh", result: "'11f6ad'"},
		{name: "side effect only", code: "import 'util'\n'loaded'", result: "'loaded'"},
		{name: "dynamic import", code: "(await import('path')).sep", result: "'/'"},
		{name: "missing module", code: "import nope from 'no-such-module-kiln'", errName: "Error", errValue: "no-such-module-kiln"},
		{name: "a method named import", code: "const o = { import(x) { return x + 1 } }\no.import(1)", result: "2"},
		{name: "a string is not an import", code: "'import x from \"y\"'", result: "'import x from \"y\"'"},
	})
}

func TestNodeStreamsLive(t *testing.T) {
	k := start(t, NewNode, "node")
	o := execute(t, k, "for (let i = 0; i < 3; i++) { console.log(i); await new Promise(r => setTimeout(r, 300)) }", nil, 0)
	if o.stdout != "0\n1\n2\n" {
		t.Fatalf("stdout = %q", o.stdout)
	}
	if o.firstOut > 500*time.Millisecond || o.elapsed < 800*time.Millisecond {
		t.Errorf("first output after %v of %v: not live", o.firstOut, o.elapsed)
	}
}

func TestNodeLargeOutput(t *testing.T) {
	k := start(t, NewNode, "node")
	bigOutput(t, k, "process.stdout.write('x'.repeat(20 << 20)); undefined", 20<<20)
	check(t, k, []cell{{name: "still usable", code: "1 + 1", result: "2"}})
}

func TestNodeRestart(t *testing.T) {
	k := start(t, NewNode, "node")
	check(t, k, []cell{{name: "set", code: "var z = 1"}})
	if err := k.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	o := execute(t, k, "typeof z", nil, 0)
	if o.count != 1 || o.results[0]["text/plain"] != "'undefined'" {
		t.Errorf("after restart: count %d, results %v", o.count, o.results)
	}
}

func TestTypeScriptRunsJavaScript(t *testing.T) {
	k := start(t, NewTypeScript, "node")
	check(t, k, []cell{
		{name: "plain js", code: "const s = [1, 2, 3].map(n => n * 2)\ns", result: "[ 2, 4, 6 ]"},
	})
}

func TestExecutionCount(t *testing.T) {
	k := start(t, NewNode, "node")
	for i := 1; i <= 3; i++ {
		if o := execute(t, k, "1", nil, 0); o.count != i {
			t.Errorf("count = %d, want %d", o.count, i)
		}
	}
}

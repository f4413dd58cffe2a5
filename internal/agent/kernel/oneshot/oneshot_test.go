package oneshot

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// programs per language: hello world (with unicode), a compile error, a
// non-zero exit after output, an endless loop, 20 MB of output.
var programs = map[string]struct{ tool, hello, broken, exit3, loop, big string }{
	"c": {"gcc",
		"#include <stdio.h>\nint main(){printf(\"héllo ✓\\n\");return 0;}",
		"int main(){ return nope; }",
		"#include <stdio.h>\nint main(){printf(\"out\\n\");fprintf(stderr,\"err\\n\");return 3;}",
		"int main(){for(;;);}",
		"#include <stdio.h>\nint main(){for(int i=0;i<20*1024;i++){for(int j=0;j<1023;j++)putchar('x');putchar('\\n');}return 0;}"},
	"cpp": {"g++",
		"#include <iostream>\nint main(){std::cout<<\"héllo ✓\"<<std::endl;}",
		"int main(){ return nope; }",
		"#include <iostream>\nint main(){std::cout<<\"out\"<<std::endl;std::cerr<<\"err\"<<std::endl;return 3;}",
		"int main(){for(;;);}",
		"#include <cstdio>\nint main(){for(int i=0;i<20*1024;i++){for(int j=0;j<1023;j++)putchar('x');putchar('\\n');}}"},
	"go": {"go",
		"package main\nimport \"fmt\"\nfunc main(){fmt.Println(\"héllo ✓\")}",
		"package main\nfunc main(){ nope() }",
		"package main\nimport (\"fmt\"; \"os\")\nfunc main(){fmt.Println(\"out\"); fmt.Fprintln(os.Stderr, \"err\"); os.Exit(3)}",
		"package main\nfunc main(){for{}}",
		"package main\nimport (\"bufio\"; \"os\"; \"strings\")\nfunc main(){w := bufio.NewWriter(os.Stdout); l := strings.Repeat(\"x\", 1023)+\"\\n\"; for i := 0; i < 20*1024; i++ { w.WriteString(l) }; w.Flush()}"},
	"rust": {"rustc",
		"fn main(){println!(\"héllo ✓\");}",
		"fn main(){ nope(); }",
		"fn main(){println!(\"out\"); eprintln!(\"err\"); std::process::exit(3);}",
		"fn main(){loop{}}",
		"use std::io::Write;\nfn main(){let o = std::io::stdout(); let mut w = std::io::BufWriter::new(o.lock()); let l = \"x\".repeat(1023) + \"\\n\"; for _ in 0..20*1024 { w.write_all(l.as_bytes()).unwrap(); }}"},
	"java": {"javac",
		"public class Hello { public static void main(String[] a){ System.out.println(\"héllo ✓\"); } }",
		"public class Broken { public static void main(String[] a){ nope(); } }",
		"class Main { public static void main(String[] a){ System.out.println(\"out\"); System.err.println(\"err\"); System.exit(3); } }",
		"public class Loop { public static void main(String[] a){ for(;;){} } }",
		"public class Big { public static void main(String[] a){ var o = new java.io.PrintStream(new java.io.BufferedOutputStream(System.out, 1<<16)); String l = \"x\".repeat(1023); for (int i = 0; i < 20*1024; i++) o.println(l); o.flush(); } }"},
}

type outcome struct {
	stdout, stderr string
	err            *api.ExecutionError
	count          int
	runErr         error
	elapsed        time.Duration
}

func execute(k kernel.Kernel, code string, timeout time.Duration) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var o outcome
	var out, errb strings.Builder
	t0 := time.Now()
	o.count, o.runErr = k.Execute(ctx, code, nil, func(ev api.Event) error {
		switch ev.Type {
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errb.Write(ev.Data)
		case api.EventExecutionError:
			o.err = ev.ExecutionError
		}
		return nil
	})
	o.elapsed = time.Since(t0)
	o.stdout, o.stderr = out.String(), errb.String()
	return o
}

func TestOneshot(t *testing.T) {
	for _, lang := range Languages() {
		t.Run(lang, func(t *testing.T) {
			p := programs[lang]
			if _, err := exec.LookPath(p.tool); err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatalf("%s is required in CI: %v", p.tool, err)
				}
				t.Skipf("%s not installed: %v", p.tool, err)
			}
			k, err := New(lang)(context.Background(), kernel.Options{Cwd: t.TempDir(), Env: os.Environ()})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			tests := []struct {
				name            string
				code            string
				timeout         time.Duration
				stdout, stderr  string
				errName, errVal string
				ctxErr          bool
			}{
				{name: "hello", code: p.hello, stdout: "héllo ✓\n"},
				{name: "compile error", code: p.broken, errName: "CompileError", errVal: ":"},
				{name: "exit status", code: p.exit3, stdout: "out\n", stderr: "err\n", errName: "ExitError", errVal: "exit status 3"},
				{name: "timeout", code: p.loop, timeout: 8 * time.Second, errName: "Interrupted", ctxErr: true},
			}
			for i, tt := range tests {
				if tt.timeout == 0 {
					tt.timeout = 2 * time.Minute
				}
				o := execute(k, tt.code, tt.timeout)
				if errors.Is(o.runErr, context.DeadlineExceeded) != tt.ctxErr || (!tt.ctxErr && o.runErr != nil) {
					t.Fatalf("%s: Execute error %v", tt.name, o.runErr)
				}
				if o.count != i+1 {
					t.Errorf("%s: count = %d, want %d", tt.name, o.count, i+1)
				}
				if !tt.ctxErr && (o.stdout != tt.stdout || o.stderr != tt.stderr) {
					t.Errorf("%s: stdout %q stderr %q, want %q %q", tt.name, o.stdout, o.stderr, tt.stdout, tt.stderr)
				}
				var name, val string
				if o.err != nil {
					name, val = o.err.Name, o.err.Value
				}
				if name != tt.errName || !strings.Contains(val, tt.errVal) {
					t.Errorf("%s: error %q %q, want %q %q (%+v)", tt.name, name, val, tt.errName, tt.errVal, o.err)
				}
				if tt.name == "compile error" && (o.err == nil || !strings.Contains(o.err.Traceback, "nope")) {
					t.Errorf("compile error: traceback %+v lacks the compiler output", o.err)
				}
				if tt.ctxErr && o.elapsed > tt.timeout+3*time.Second {
					t.Errorf("%s: took %v to kill", tt.name, o.elapsed)
				}
			}
			// 20 MB of output streams through.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			total := 0
			if _, err := k.Execute(ctx, p.big, nil, func(ev api.Event) error {
				if ev.Type == api.EventStdout {
					total += len(ev.Data)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if total != 20<<20 {
				t.Errorf("got %d bytes, want %d", total, 20<<20)
			}
		})
	}
}

func TestUnknownLanguage(t *testing.T) {
	if _, err := New("cobol")(context.Background(), kernel.Options{}); err == nil {
		t.Error("New(cobol) succeeded")
	}
}

// Java cells may be snippets, as in jshell: statements, methods, imports
// and a last expression (the cell's result) without a class.
func TestJavaSnippets(t *testing.T) {
	if _, err := exec.LookPath("javac"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("javac is required in CI: %v", err)
		}
		t.Skipf("javac not installed: %v", err)
	}
	k, err := New("java")(context.Background(), kernel.Options{Cwd: t.TempDir(), Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for _, tt := range []struct {
		name, code, stdout, result, errName string
	}{
		{"statements", "int x = 20;\nSystem.out.println(x * 2 + 2);", "42\n", "", ""},
		{"last expression", "int x = 20;\nx * 2 + 2", "", "42", ""},
		{"void call last", "System.out.println(\"hi\")", "hi\n", "", ""},
		{"imports and methods", "import java.util.*;\n// a helper\nstatic int twice(int n) { return 2 * n; }\nString greet(String who) { return \"hi \" + who; }\n" +
			"List<Integer> xs = new ArrayList<>(List.of(3, 1, 2));\nCollections.sort(xs);\nfor (int v : xs) { System.out.print(twice(v)); }\nSystem.out.println();\ngreet(\"java\")",
			"246\n", "hi java", ""},
		{"if else and text", "String s = \"a;b}\";\nif (s.length() > 3) { System.out.println(\"long\"); } else { System.out.println(\"short\"); }", "long\n", "", ""},
		{"compile error", "int x = ;", "", "", "CompileError"},
		{"exception", "throw new IllegalStateException(\"boom\");", "", "", "ExitError"},
		{"a program still works", "public class P { public static void main(String[] a) { System.out.println(\"p\"); } }", "p\n", "", ""},
	} {
		var out strings.Builder
		var result, errName string
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, err := k.Execute(ctx, tt.code, nil, func(ev api.Event) error {
			switch {
			case ev.Type == api.EventStdout:
				out.Write(ev.Data)
			case ev.Result != nil && ev.Result.IsMainResult:
				result = ev.Result.Data["text/plain"]
			case ev.ExecutionError != nil:
				errName = ev.ExecutionError.Name
			}
			return nil
		})
		cancel()
		if err != nil || out.String() != tt.stdout || result != tt.result || errName != tt.errName {
			t.Errorf("%s: stdout %q result %q error %q (%v); want %q %q %q", tt.name, out.String(), result, errName, err, tt.stdout, tt.result, tt.errName)
		}
	}
}

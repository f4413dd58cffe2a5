package progress

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// entry is a log line at t0+ms, as the builder writes it: its stage
// from the step, the recipe's size (total) and its event.
func entry(ms, step int, event, msg string) api.TemplateLogEntry {
	stage := "step"
	if step < 0 {
		stage = "base"
	}
	return api.TemplateLogEntry{Time: t0.Add(time.Duration(ms) * time.Millisecond), Level: "info", Step: step, Message: msg,
		Stage: stage, Event: event}
}

func output(ms, step int, msg string) api.TemplateLogEntry {
	e := entry(ms, step, "", msg)
	e.Output = true
	return e
}

// with sets the fields entry does not.
func with(e api.TemplateLogEntry, set func(*api.TemplateLogEntry)) api.TemplateLogEntry {
	set(&e)
	return e
}

func total(n int, log ...api.TemplateLogEntry) []api.TemplateLogEntry {
	for i := range log {
		log[i].Total = n
	}
	return log
}

func finalize(e *api.TemplateLogEntry) { e.Stage = "finalize" }

// good is the log of a build with a cached COPY, a RUN with output, an ENV
// and a WORKDIR (steps without a "done" line) and a final stage.
var good = total(4,
	entry(0, -1, api.LogBegin, "[base] FROM template base"),
	entry(100, 0, api.LogBegin, `[1/4] ENV GREETING="hi"`),
	with(entry(200, 1, api.LogBegin, "[2/4] COPY data.txt /data.txt CACHED"), func(e *api.TemplateLogEntry) { e.Cached = true }),
	entry(300, 2, api.LogBegin, "[3/4] RUN apt-get install -y cowsay"),
	output(1300, 2, "Reading package lists..."),
	output(2300, 2, "\x1b[1;31mSetting up\x1b[0m cowsay\x1b]0;title\a\r"),
	with(entry(4500, 2, api.LogDone, "[3/4] done in 4.2s"), func(e *api.TemplateLogEntry) { e.ElapsedMs = 4200 }),
	entry(4600, 3, api.LogBegin, "[4/4] WORKDIR /app"),
	with(entry(4700, -1, api.LogBegin, "[finalize] making the working directory /app"), finalize),
	with(entry(4750, -1, "", "[finalize] warm snapshot taken in 0s"), finalize),
	with(entry(4800, -1, api.LogReady, "build tb_1 ready in 4.8s"), finalize),
)

// bad is the log of a build whose RUN fails; its output carries an
// attempt to clear the user's screen.
var bad = total(2,
	entry(0, -1, api.LogBegin, "[base] FROM image debian:bookworm"),
	entry(10, -1, "", "[base] layer 1/1 3f2a CACHED"),
	with(entry(20, -1, "", "Dockerfile:3: EXPOSE is ignored"), func(e *api.TemplateLogEntry) { e.Level = "warn" }),
	entry(50, 0, api.LogBegin, "[1/2] RUN echo boom; exit 3"),
	output(550, 0, "\x1b[2J\x1b[Hboom"),
	with(entry(600, 0, api.LogError, "build failed: step 1 (RUN): the command exited with status 3\nboom"), func(e *api.TemplateLogEntry) { e.Level = "error" }),
)

func TestPlain(t *testing.T) {
	tests := []struct {
		name string
		log  []api.TemplateLogEntry
		want string
	}{
		{"good", good, `#1 [base] FROM template base
#1 DONE 0.1s
#2 [1/4] ENV GREETING="hi"
#2 DONE 0.1s
#3 [2/4] COPY data.txt /data.txt
#3 CACHED
#4 [3/4] RUN apt-get install -y cowsay
#4 1.000 Reading package lists...
#4 2.000 Setting up cowsay
#4 DONE 4.2s
#5 [4/4] WORKDIR /app
#5 DONE 0.1s
#6 [finalize] making the working directory /app
#6 [finalize] warm snapshot taken in 0s
#6 DONE 0.1s
build tb_1 ready in 4.8s
`},
		{"bad", bad, `#1 [base] FROM image debian:bookworm
#1 [base] layer 1/1 3f2a CACHED
#1 WARN: Dockerfile:3: EXPOSE is ignored
#1 DONE 0.1s
#2 [1/2] RUN echo boom; exit 3
#2 0.500 boom
#2 ERROR: step 1 (RUN): the command exited with status 3
`},
		// A follow that starts in the middle of a step (kiln template
		// logs -f with an offset) still numbers it right; its times
		// count from the first line seen.
		{"mid-step", good[4:7], `#4 0.000 Reading package lists...
#4 1.000 Setting up cowsay
#4 DONE 4.2s
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			d := New(&out, Options{})
			for _, e := range tt.log {
				d.Add(e)
				d.Tick() // nothing in plain mode
			}
			d.Close()
			if out.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}

// TestLive feeds the log to a live display one entry at a time, a local
// second apart, and checks the screen a terminal would show after each.
func TestLive(t *testing.T) {
	now := t0
	var term screen
	d := New(&term, Options{Live: true, Width: 60, Now: func() time.Time { return now }, OutputLines: 2})
	add := func(e api.TemplateLogEntry) {
		now = now.Add(time.Second)
		d.Add(e)
	}
	for _, e := range good[:4] {
		add(e)
	}
	term.want(t, "RUN starts",
		`=> #1 [base] FROM template base  DONE 0.1s`,
		`=> #2 [1/4] ENV GREETING="hi"  DONE 0.1s`,
		`=> #3 [2/4] COPY data.txt /data.txt  CACHED`,
		`=> #4 [3/4] RUN apt-get install -y cowsay  0.0s`)
	add(good[4])
	add(good[5])
	add(output(2400, 2, "a line far too long for the terminal's sixty columns, so cut"))
	now = now.Add(1500 * time.Millisecond)
	d.Tick()
	term.want(t, "RUN output, 1.5s after its last line",
		`=> #1 [base] FROM template base  DONE 0.1s`,
		`=> #2 [1/4] ENV GREETING="hi"  DONE 0.1s`,
		`=> #3 [2/4] COPY data.txt /data.txt  CACHED`,
		`=> #4 [3/4] RUN apt-get install -y cowsay  3.6s`,
		`     Setting up cowsay`,
		`     a line far too long for the terminal's sixty columns,…`)
	for _, e := range good[6:] {
		add(e)
	}
	d.Close()
	term.want(t, "the end",
		`=> #1 [base] FROM template base  DONE 0.1s`,
		`=> #2 [1/4] ENV GREETING="hi"  DONE 0.1s`,
		`=> #3 [2/4] COPY data.txt /data.txt  CACHED`,
		`=> #4 [3/4] RUN apt-get install -y cowsay  DONE 4.2s`,
		`=> #5 [4/4] WORKDIR /app  DONE 0.1s`,
		`=> #6 [finalize] making the working directory /…  DONE 0.1s`,
		`build tb_1 ready in 4.8s`)

	term = screen{}
	d = New(&term, Options{Live: true, Width: 90, Now: func() time.Time { return now }})
	for _, e := range bad {
		add(e)
	}
	d.Close()
	screenAfterFail := []string{
		`#1 WARN: Dockerfile:3: EXPOSE is ignored`,
		`=> #1 [base] FROM image debian:bookworm  DONE 0.1s`,
		`=> #2 [1/2] RUN echo boom; exit 3  ERROR: step 1 (RUN): the command exited with status 3`,
		`     boom`}
	term.want(t, "a failed RUN keeps its output on screen", screenAfterFail...)
	d.Tick()
	d.Add(entry(700, 1, api.LogBegin, "[2/2] RUN true"))
	term.want(t, "nothing is drawn after Close", screenAfterFail...)
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                           "plain",
		"\x1b[31mred\x1b[0m":              "red",
		"50%\r75%\r100%\r":                "100%",
		"a\tb\nc":                         "a b c",
		"\x1b]0;title\x07x\x00\x7f\u009b": "x",
		"\x1b]8;;http://x\x1b\\link":      "link",
		"héllo ✓":                         "héllo ✓",
	} {
		if got := Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

// screen is a terminal that understands what the live display writes:
// text, \n, \r, cursor up (CSI n A), erase line (CSI K), erase below
// (CSI J) and colours (CSI … m). Anything else fails the test.
type screen struct {
	lines    [][]rune
	row, col int
	bad      string
}

func (s *screen) Write(p []byte) (int, error) {
	r := []rune(string(p))
	for i := 0; i < len(r); i++ {
		for s.row >= len(s.lines) {
			s.lines = append(s.lines, nil)
		}
		switch c := r[i]; c {
		case '\n':
			s.row, s.col = s.row+1, 0
		case '\r':
			s.col = 0
		case 0x1b:
			j := i + 2
			for j < len(r) && (r[j] >= '0' && r[j] <= '9' || r[j] == ';') {
				j++
			}
			if i+1 >= len(r) || r[i+1] != '[' || j >= len(r) {
				s.bad = string(r[i:])
				return len(p), nil
			}
			n, _ := strconv.Atoi(string(r[i+2 : j]))
			switch r[j] {
			case 'A':
				s.row = max(s.row-n, 0)
			case 'K':
				s.lines[s.row] = s.lines[s.row][:min(s.col, len(s.lines[s.row]))]
			case 'J':
				s.lines[s.row] = s.lines[s.row][:min(s.col, len(s.lines[s.row]))]
				s.lines = s.lines[:s.row+1]
			case 'm':
			default:
				s.bad = string(r[i : j+1])
			}
			i = j
		default:
			if c < 0x20 {
				s.bad = strconv.QuoteRune(c)
			}
			line := s.lines[s.row]
			for len(line) <= s.col {
				line = append(line, ' ')
			}
			line[s.col] = c
			s.lines[s.row], s.col = line, s.col+1
		}
	}
	return len(p), nil
}

// want checks what the screen shows (trailing empty lines aside).
func (s *screen) want(t *testing.T, what string, lines ...string) {
	t.Helper()
	var got []string
	for _, l := range s.lines {
		got = append(got, string(l))
	}
	for len(got) > 0 && got[len(got)-1] == "" {
		got = got[:len(got)-1]
	}
	if s.bad != "" {
		t.Errorf("%s: the display wrote %q, which a terminal would act on", what, s.bad)
	}
	if strings.Join(got, "\n") != strings.Join(lines, "\n") {
		t.Errorf("%s: screen:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(lines, "\n"))
	}
}

// The display follows the entries' fields, not their text: a RUN whose
// instruction ends in " CACHED" runs, and a line of the build's own that
// reads like a step's end ends nothing.
func TestFieldsNotText(t *testing.T) {
	var out strings.Builder
	d := New(&out, Options{})
	for _, e := range total(1,
		entry(0, -1, api.LogBegin, "[base] FROM template base"),
		entry(100, 0, api.LogBegin, "[1/1] RUN echo CACHED"),
		entry(200, 0, "", "[1/1] done in 9s"),
		output(300, 0, "CACHED"),
		entry(1100, 0, api.LogDone, "[1/1] done in 1s"),
		with(entry(1200, -1, api.LogReady, "build tb_2 ready in 1.2s"), finalize),
	) {
		d.Add(e)
	}
	d.Close()
	want := `#1 [base] FROM template base
#1 DONE 0.1s
#2 [1/1] RUN echo CACHED
#2 [1/1] done in 9s
#2 0.200 CACHED
#2 DONE 1.0s
build tb_2 ready in 1.2s
`
	if out.String() != want {
		t.Errorf("display:\n%s\nwant:\n%s", out.String(), want)
	}
}

package progress

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// entry is a log line at t0+ms, as the builder writes it.
func entry(ms, step int, msg string) api.TemplateLogEntry {
	return api.TemplateLogEntry{Time: t0.Add(time.Duration(ms) * time.Millisecond), Level: "info", Step: step, Message: msg}
}

func output(ms, step int, msg string) api.TemplateLogEntry {
	e := entry(ms, step, msg)
	e.Output = true
	return e
}

// good is the log of a build with a cached COPY, a RUN with output, an ENV
// and a WORKDIR (steps without a "done" line) and a final stage.
var good = []api.TemplateLogEntry{
	entry(0, -1, "[base] FROM template base"),
	entry(100, 0, `[1/4] ENV GREETING="hi"`),
	entry(200, 1, "[2/4] COPY data.txt /data.txt CACHED"),
	entry(300, 2, "[3/4] RUN apt-get install -y cowsay"),
	output(1300, 2, "Reading package lists..."),
	output(2300, 2, "\x1b[1;31mSetting up\x1b[0m cowsay\x1b]0;title\a\r"),
	entry(4500, 2, "[3/4] done in 4.2s"),
	entry(4600, 3, "[4/4] WORKDIR /app"),
	entry(4700, -1, "[finalize] making the working directory /app"),
	entry(4750, -1, "[finalize] warm snapshot taken in 0s"),
	entry(4800, -1, "build tb_1 ready in 4.8s"),
}

// bad is the log of a build whose RUN fails; its output carries an
// attempt to clear the user's screen.
var bad = []api.TemplateLogEntry{
	entry(0, -1, "[base] FROM image debian:bookworm"),
	entry(10, -1, "[base] layer 1/1 3f2a CACHED"),
	{Time: t0.Add(20 * time.Millisecond), Level: "warn", Step: -1, Message: "Dockerfile:3: EXPOSE is ignored"},
	entry(50, 0, "[1/2] RUN echo boom; exit 3"),
	output(550, 0, "\x1b[2J\x1b[Hboom"),
	{Time: t0.Add(600 * time.Millisecond), Level: "error", Step: 0, Message: "build failed: step 1 (RUN): the command exited with status 3\nboom"},
}

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
	d.Add(entry(700, 1, "[2/2] RUN true"))
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

// Package progress shows a template build's log as it happens, the way
// BuildKit does: on a terminal a live display, redrawn in place with ANSI
// escapes (the running step with its elapsed time and its last lines of
// output; finished steps above it, one line each with DONE, CACHED or
// ERROR); elsewhere (pipes, CI logs) plain lines:
//
//	#1 [base] FROM template base
//	#1 DONE 0.1s
//	#2 [1/3] COPY data.txt /data.txt
//	#2 CACHED
//	#3 [2/3] RUN apt-get install -y cowsay
//	#3 1.204 Setting up cowsay (3.03+dfsg2-8) ...
//	#3 DONE 4.2s
//
// A build's parts are numbered as BuildKit numbers its vertices: #1 the
// base, #N+1 step N of the recipe, then the final stage (start command,
// ready check, warm snapshot). It follows the structured fields of the
// builder's log lines (internal/template/builder), not their text: stage
// and step say which part a line is about, total the recipe's size, event
// where a part begins ("begin", cached or not) and ends ("done", and
// "ready" or "error" for the build). Everything it prints is sanitised
// first: log lines carry a sandbox's output, which must not drive the
// user's terminal.
package progress

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Options configure a Display.
type Options struct {
	// Live redraws the display in place (a terminal); otherwise it
	// prints plain lines.
	Live bool
	// Width is the terminal's width in columns; live lines are cut to
	// fit it (0: not cut).
	Width int
	// Now is the clock of the live display's elapsed times (default
	// time.Now).
	Now func() time.Time
	// OutputLines is how many lines of the running step's output the
	// live display shows (default 5).
	OutputLines int
}

// Display renders a build's log entries. Its methods are safe for
// concurrent use (Tick runs on a timer while Add follows the log).
type Display struct {
	mu    sync.Mutex
	w     io.Writer
	opt   Options
	total int // steps in the recipe
	cur   *vertex
	drawn int  // lines of the live area on screen
	ended bool // Close was called
}

// vertex is one part of the build: the base, a step, or the final stage.
type vertex struct {
	num    int
	title  string
	start  time.Time // the entry time of its first line
	last   time.Time // the entry time of its latest line
	seen   time.Time // local clock when the latest line arrived
	out    []string  // its last output lines (live)
	closed bool
}

// New returns a display writing to w.
func New(w io.Writer, opt Options) *Display {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.OutputLines <= 0 {
		opt.OutputLines = 5
	}
	return &Display{w: w, opt: opt}
}

// escRE matches ANSI control sequences (colours, cursor moves) and
// operating system commands (window titles, hyperlinks).
var escRE = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?`)

// Add shows one log entry.
func (d *Display) Add(e api.TemplateLogEntry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended {
		return
	}
	msg := Sanitize(e.Message)
	var commit []string
	if !e.Output {
		var ok bool
		if commit, ok = d.special(e, e.Message, msg); ok {
			d.flush(commit)
			return
		}
	}
	num, header := d.vertexOf(e, msg)
	commit = d.enter(num, e, header)
	v := d.cur
	switch {
	case e.Cached:
		// enter showed it
	case header != "" && v.title == "":
		v.title = header
		commit = append(commit, d.plain(v, header))
	case e.Level == "warn":
		commit = append(commit, fmt.Sprintf("#%d WARN: %s", v.num, msg))
	case e.Output:
		v.out = appendTail(v.out, msg, d.opt.OutputLines)
		if !d.opt.Live {
			commit = append(commit, fmt.Sprintf("#%d %.3f %s", v.num, e.Time.Sub(v.start).Seconds(), msg))
		}
	default:
		v.out = appendTail(v.out, msg, d.opt.OutputLines)
		commit = append(commit, d.plain(v, msg))
	}
	d.flush(commit)
}

// special handles the lines that end a part or the build; ok reports
// whether e was one.
func (d *Display) special(e api.TemplateLogEntry, raw, msg string) (commit []string, ok bool) {
	switch e.Event {
	case api.LogError:
		// The reason's first line names the step; the rest is the tail
		// of its output, shown already.
		first, _, _ := strings.Cut(strings.TrimPrefix(raw, "build failed: "), "\n")
		first = Sanitize(first)
		if d.cur == nil || d.cur.closed {
			return []string{"ERROR: " + first}, true
		}
		return d.close(e.Time, "ERROR: "+first), true
	case api.LogReady:
		if d.cur != nil && !d.cur.closed {
			commit = d.close(e.Time, "")
		}
		return append(commit, msg), true
	case api.LogDone:
		if d.cur == nil || d.cur.num != e.Step+2 || d.cur.closed {
			return nil, false
		}
		d.cur.last = e.Time
		status := ""
		if e.ElapsedMs > 0 { // the builder's measure: the step may have begun before this display
			status = "DONE " + seconds(time.Duration(e.ElapsedMs)*time.Millisecond)
		}
		return d.close(e.Time, status), true
	}
	return nil, false
}

// vertexOf is the part an entry belongs to, and its title when the entry
// begins it ("" otherwise).
func (d *Display) vertexOf(e api.TemplateLogEntry, msg string) (int, string) {
	if e.Total > 0 {
		d.total = e.Total
	}
	header := ""
	if e.Event == api.LogBegin && !e.Output {
		header = msg
		if e.Cached {
			header = strings.TrimSuffix(msg, " CACHED")
		}
	}
	switch {
	case e.Stage == "step" && e.Step >= 0:
		return e.Step + 2, header
	case e.Stage == "finalize":
		return d.total + 2, header
	case e.Stage == "base":
		return 1, header
	}
	// A line without a stage (a server before them): the current part's.
	if d.cur != nil {
		return d.cur.num, ""
	}
	return 1, ""
}

// enter makes num the current part, closing the one before (a part
// without a "done" line, such as ENV, ends when the next begins).
func (d *Display) enter(num int, e api.TemplateLogEntry, header string) []string {
	var commit []string
	if d.cur != nil && d.cur.num == num {
		if header != "" && e.Cached && !d.cur.closed {
			d.cur.title = header
			commit = append(commit, d.plain(d.cur, d.cur.title))
			return append(commit, d.close(e.Time, "CACHED")...)
		}
		d.cur.last, d.cur.seen = e.Time, d.opt.Now()
		return nil
	}
	if d.cur != nil && !d.cur.closed {
		commit = d.close(e.Time, "")
	}
	d.cur = &vertex{num: num, start: e.Time, last: e.Time, seen: d.opt.Now()}
	if e.Cached {
		d.cur.title = header
		commit = append(commit, d.plain(d.cur, d.cur.title))
		return append(commit, d.close(e.Time, "CACHED")...)
	}
	return commit
}

// close ends the current part with status (DONE …, CACHED, ERROR: …; ""
// for DONE with the time its lines span).
func (d *Display) close(at time.Time, status string) []string {
	v := d.cur
	v.closed = true
	if status == "" {
		status = "DONE " + seconds(at.Sub(v.start))
	}
	if !d.opt.Live {
		return []string{fmt.Sprintf("#%d %s", v.num, status)}
	}
	commit := []string{d.row(v, status)}
	if strings.HasPrefix(status, "ERROR") {
		// The output that led to the error stays on screen.
		for _, o := range v.out {
			commit = append(commit, d.fit("     "+o))
		}
	}
	return commit
}

// plain is a line of part v as plain mode prints it (nil in live mode,
// where the live area shows it).
func (d *Display) plain(v *vertex, msg string) string {
	if d.opt.Live {
		return ""
	}
	return fmt.Sprintf("#%d %s", v.num, msg)
}

// Tick redraws the live display (the running part's elapsed time).
func (d *Display) Tick() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.opt.Live && !d.ended {
		d.flush(nil)
	}
}

// Close ends the display, leaving what it shows on screen; later calls
// do nothing.
func (d *Display) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.opt.Live && !d.ended {
		d.flush(nil)
		d.drawn = 0
	}
	d.ended = true
}

// flush prints the committed lines and, live, redraws the live area
// under them.
func (d *Display) flush(commit []string) {
	var b strings.Builder
	if !d.opt.Live {
		for _, l := range commit {
			b.WriteString(l + "\n")
		}
		io.WriteString(d.w, b.String())
		return
	}
	if d.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\r", d.drawn)
	}
	for _, l := range commit {
		if l != "" {
			b.WriteString(d.fit(l) + "\x1b[K\n")
		}
	}
	live := d.liveArea()
	for _, l := range live {
		b.WriteString(l + "\x1b[K\n")
	}
	b.WriteString("\x1b[J")
	d.drawn = len(live)
	io.WriteString(d.w, b.String())
}

// liveArea is the running part: its line with the time it has taken so
// far, and its last output lines, dimmed.
func (d *Display) liveArea() []string {
	v := d.cur
	if v == nil || v.closed {
		return nil
	}
	elapsed := v.last.Sub(v.start) + d.opt.Now().Sub(v.seen)
	lines := []string{d.row(v, seconds(elapsed))}
	for _, o := range v.out {
		lines = append(lines, "\x1b[2m"+d.fit("     "+o)+"\x1b[0m")
	}
	return lines
}

// row is the live display's line of part v: its title, cut so that its
// status fits on the line too.
func (d *Display) row(v *vertex, status string) string {
	head, title, tail := fmt.Sprintf("=> #%d ", v.num), []rune(v.title), "  "+status
	if title == nil {
		title = []rune("…")
	}
	if d.opt.Width > 1 {
		room := max(d.opt.Width-1-len([]rune(head))-len([]rune(tail)), 10)
		if len(title) > room {
			title = append(title[:room-1], '…')
		}
	}
	return d.fit(head + string(title) + tail)
}

// fit cuts a line to the terminal's width.
func (d *Display) fit(s string) string {
	if d.opt.Width <= 1 {
		return s
	}
	r := []rune(s)
	if len(r) < d.opt.Width {
		return s
	}
	return string(r[:d.opt.Width-2]) + "…"
}

func appendTail(lines []string, s string, n int) []string {
	lines = append(lines, s)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

func seconds(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// Sanitize makes a log line safe to print on a terminal: what a carriage
// return would overwrite goes, tabs and newlines become spaces, and every other
// control character (escape sequences included) is dropped.
func Sanitize(s string) string {
	s = escRE.ReplaceAllString(s, "")
	if i := strings.LastIndexByte(strings.TrimRight(s, "\r"), '\r'); i >= 0 {
		s = s[i+1:]
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t', r == '\n':
			return ' '
		case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
			return -1
		}
		return r
	}, s)
}

package builder

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// A build's log is a file of NDJSON entries (BuildDir/build.log), one per
// line, appended as the build goes; Logs reads it from an entry offset and,
// while the build runs, follows it.

// Log levels.
const (
	levelInfo  = "info"
	levelWarn  = "warn"
	levelError = "error"
)

// LogEntry is one line of a build's log, as the API serves it.
type LogEntry = api.TemplateLogEntry

const (
	logName = "build.log"
	// maxLogEntries bounds one build's log; step output beyond it is
	// dropped (the build's own lines are still written).
	maxLogEntries = 50000
	// maxLineBytes bounds one line of step output.
	maxLineBytes = 4 << 10
)

func entry(level string, step int, msg string) LogEntry {
	return LogEntry{Time: time.Now().UTC(), Level: level, Step: step, Message: msg}
}

// logf logs a line about the part of the build being run.
func (r *run) logf(level, format string, a ...any) { r.logEvent("", level, format, a...) }

// logEvent logs a line marked with event (api.LogDone, LogReady,
// LogError; "": none). A part's first line is marked api.LogBegin, and
// cached when the step's layer came from the cache.
func (r *run) logEvent(event, level, format string, a ...any) {
	r.log.add(r.entry(event, level, fmt.Sprintf(format, a...)), false)
}

// output logs a line a step printed, and keeps it in the tail a
// failure's reason quotes.
func (r *run) output(line string) {
	r.tail.add(line)
	r.log.add(r.entry("", levelInfo, line), true)
}

// outputErr is output for a line of standard error.
func (r *run) outputErr(line string) {
	r.tail.addErr(line)
	r.log.add(r.entry("", levelInfo, line), true)
}

// entry is a line of the part of the build being run, with its stage,
// the recipe's size and its event.
func (r *run) entry(event, level, msg string) LogEntry {
	e := entry(level, r.step, msg)
	e.Stage, e.Total = r.stage, len(r.spec.Steps)
	if r.step >= 0 {
		e.Stage = "step"
	}
	if part := fmt.Sprint(e.Stage, r.step); part != r.log.part && event == "" {
		r.log.part, r.log.partStart, event = part, e.Time, api.LogBegin
		e.Cached = r.hit && r.step >= 0
	}
	if event == api.LogDone {
		e.ElapsedMs = e.Time.Sub(r.log.partStart).Milliseconds()
	}
	e.Event = event
	return e
}

// observe counts a step that ended well in the build's record (the
// build's end stores the counts) and tells the Observer of a layer step
// (RUN, COPY, ADD), and whether its layer came from the cache (r.hit).
func (r *run) observe(err error, layerStep bool) error {
	if err == nil {
		r.rec.StepsDone++
		if r.hit {
			r.rec.CachedSteps++
		}
		if o := r.b.cfg.Observer; o != nil && layerStep {
			o.StepDone(r.hit)
		}
	}
	r.hit = false
	return err
}

// buildLog is the log of a running build: the file, and the entries so
// far for followers.
type buildLog struct {
	mu        sync.Mutex
	f         *os.File
	entries   []LogEntry
	truncated bool
	ended     bool
	changed   chan struct{} // closed and replaced on every append
	// The part of the build the last line was about, and when it began
	// (the run's goroutine's).
	part      string
	partStart time.Time
}

func openLog(dir string) (*buildLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, logName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening build log: %w", err)
	}
	return &buildLog{f: f, changed: make(chan struct{})}, nil
}

// add appends an entry; output lines (output true) are dropped once the
// log is full.
func (l *buildLog) add(e LogEntry, output bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if output && len(l.entries) >= maxLogEntries {
		if l.truncated {
			return
		}
		l.truncated = true
		e = entry(levelWarn, e.Step, fmt.Sprintf("the log is over %d lines: further output of this build is left out", maxLogEntries))
		output = false
	}
	e.Output = output
	b, _ := json.Marshal(e)
	_, _ = l.f.Write(append(b, '\n'))
	l.entries = append(l.entries, e)
	close(l.changed)
	l.changed = make(chan struct{})
}

// end closes the log: followers drain what is left and stop.
func (l *buildLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended = true
	_ = l.f.Sync()
	_ = l.f.Close()
	close(l.changed)
}

// since returns the entries from offset on, a channel closed at the next
// append, and whether the log has ended.
func (l *buildLog) since(offset int) ([]LogEntry, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var es []LogEntry
	if offset < len(l.entries) {
		es = append(es, l.entries[offset:]...)
	}
	return es, l.changed, l.ended
}

// appendLog adds one entry to the log file of a build that is not running
// (one a restart interrupted), if its dir exists.
func appendLog(dir string, e LogEntry) {
	f, err := os.OpenFile(filepath.Join(dir, logName), os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	b, _ := json.Marshal(e)
	_, _ = f.Write(append(b, '\n'))
}

// readLog calls emit with the entries of a log file from offset on.
func readLog(path string, offset int, emit func(LogEntry) error) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading build log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 0; sc.Scan(); n++ {
		if n < offset {
			continue
		}
		var e LogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a line a crash cut short
		}
		if err := emit(e); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Logs calls emit with build id's log entries from offset (an entry
// index) on. With follow, it then waits for more until the build ends or
// ctx is done.
func (b *Builder) Logs(ctx context.Context, id string, offset int, follow bool, emit func(LogEntry) error) error {
	if offset < 0 {
		return fmt.Errorf("log offset %d: %w", offset, errdefs.ErrInvalidArgument)
	}
	if _, err := b.cfg.Records.GetBuild(ctx, id); err != nil {
		return err
	}
	b.mu.Lock()
	bl := b.active[id]
	b.mu.Unlock()
	if bl == nil {
		return readLog(filepath.Join(b.buildDir(id), logName), offset, emit)
	}
	for {
		es, changed, ended := bl.log.since(offset)
		for _, e := range es {
			if err := emit(e); err != nil {
				return err
			}
		}
		offset += len(es)
		if ended && len(es) == 0 || !follow && len(es) == 0 {
			return nil
		}
		if len(es) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

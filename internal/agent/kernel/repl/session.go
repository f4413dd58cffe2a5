package repl

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// escalateAfter is how long an interrupted cell gets before the next,
// harsher interrupt step.
const escalateAfter = 2 * time.Second

// errClosed is returned by a kernel used after Close.
var errClosed = errors.New("kernel closed")

// chunk is one item read from the interpreter: output data, a sync marker,
// a control line, or the end of a stream.
type chunk struct {
	typ    api.EventType // EventStdout or EventStderr; "" for control lines
	data   []byte
	marker string
	isMark bool
	eof    bool
}

// sink receives the chunks of the running turn; without one they are
// dropped (output printed between cells, e.g. by timers).
type sink struct {
	ch   chan chunk
	done chan struct{}
}

// spec describes how to start an interpreter process.
type spec struct {
	argv   []string
	stdin  []byte // written to the child's stdin, which is then closed
	reqFD  int    // child fd reading requests: 0 (stdin) or 3
	ctlFD  int    // child fd the interpreter holds (and writes control lines to)
	token  string // marker token
	extEnv []string
}

// session is one running interpreter process. Its death is detected by
// EOF on the control pipe (which only the interpreter holds), never by
// waiting for its exit status: the agent may reap it first.
type session struct {
	pid    int
	proc   *os.Process
	token  string
	prefix []byte
	in     *os.File // requests to the interpreter
	dead   chan struct{}

	mu    sync.Mutex
	sink  *sink
	files []*os.File // our ends of the pipes
	once  sync.Once
}

func newToken() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startSession starts an interpreter in its own process group, as o's
// UID/GID when running as root.
func startSession(o kernel.Options, sp spec) (*session, error) {
	env := append(append([]string(nil), o.Env...), sp.extEnv...)
	path, err := lookPath(sp.argv[0], getenv(env, "PATH"))
	if err != nil {
		return nil, err
	}
	s := &session{token: sp.token, dead: make(chan struct{})}
	s.prefix = markerPrefix(s.token)

	var child []*os.File // closed in the parent after the start
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		return
	}
	outR, outW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	reqR, reqW, err := pipe()
	if err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW} {
			f.Close()
		}
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	ctlR, ctlW, err := pipe()
	if err != nil {
		for _, f := range []*os.File{outR, outW, errR, errW, reqR, reqW} {
			f.Close()
		}
		return nil, fmt.Errorf("creating pipe: %w", err)
	}
	child = append(child, outW, errW, reqR, ctlW)
	s.files = []*os.File{outR, errR, reqW, ctlR}
	s.in = reqW

	cmd := exec.Command(path, sp.argv[1:]...)
	cmd.Args[0] = sp.argv[0]
	cmd.Dir = o.Cwd
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = sysProcAttr(o)
	var scriptW *os.File
	switch sp.reqFD {
	case 0:
		cmd.Stdin = reqR
	default:
		r, w, err := pipe()
		if err != nil {
			s.closeFiles()
			return nil, fmt.Errorf("creating pipe: %w", err)
		}
		child = append(child, r)
		cmd.Stdin, scriptW = r, w
	}
	// fd 3 and up
	switch {
	case sp.reqFD == 3 && sp.ctlFD == 4:
		cmd.ExtraFiles = []*os.File{reqR, ctlW}
	case sp.reqFD == 0 && sp.ctlFD == 3:
		cmd.ExtraFiles = []*os.File{ctlW}
	default:
		panic("repl: unsupported fd layout")
	}
	if err := cmd.Start(); err != nil {
		s.closeFiles()
		if scriptW != nil {
			scriptW.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", sp.argv[0], err)
	}
	s.pid, s.proc = cmd.Process.Pid, cmd.Process
	// Reap it if nobody else does; its status is not used (see session).
	go cmd.Wait()
	if scriptW != nil {
		go func() {
			scriptW.Write(sp.stdin)
			scriptW.Close()
		}()
	}
	go s.readOutput(outR, api.EventStdout)
	go s.readOutput(errR, api.EventStderr)
	go s.readControl(ctlR)
	return s, nil
}

func (s *session) deliver(c chunk) {
	s.mu.Lock()
	k := s.sink
	s.mu.Unlock()
	if k == nil {
		return
	}
	select {
	case k.ch <- c:
	case <-k.done:
	}
}

func (s *session) readOutput(f *os.File, typ api.EventType) {
	sp := splitter{prefix: s.prefix}
	buf := make([]byte, 32<<10)
	data := func(b []byte) { s.deliver(chunk{typ: typ, data: b}) }
	marker := func(m string) { s.deliver(chunk{typ: typ, marker: m, isMark: true}) }
	for {
		n, err := f.Read(buf)
		if n > 0 {
			sp.feed(buf[:n], data, marker)
		}
		if err != nil {
			if len(sp.buf) > 0 {
				data(sp.buf)
			}
			s.deliver(chunk{typ: typ, eof: true})
			return
		}
	}
}

func (s *session) readControl(f *os.File) {
	defer close(s.dead)
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && err == nil {
			s.deliver(chunk{data: line[:len(line)-1]})
		}
		if err != nil {
			return
		}
	}
}

// running reports whether a turn is in progress.
func (s *session) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sink != nil
}

// signal sends sig to the interpreter (group: to its whole process group).
func (s *session) signal(sig syscall.Signal, group bool) {
	if group {
		syscall.Kill(-s.pid, sig)
		return
	}
	s.proc.Signal(sig)
}

// kill ends the interpreter and everything in its process group, and
// releases the pipes.
func (s *session) kill() {
	s.once.Do(func() {
		syscall.Kill(-s.pid, syscall.SIGKILL)
		s.proc.Kill()
		select {
		case <-s.dead:
		case <-time.After(2 * time.Second):
		}
		s.closeFiles()
	})
}

func (s *session) closeFiles() {
	for _, f := range s.files {
		f.Close()
	}
}

func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}

// turn is one request/answer exchange with the interpreter.
type turn struct {
	id       string // marker payload of this turn: id, or id:extra
	needResp bool   // a control line "id ..." ends the turn too
	emit     func(api.Event) error
	// interrupt is called when ctx is done or emit fails, with step 0, and
	// again with steps 1, 2, ... every escalateAfter until the turn ends.
	interrupt func(step int)
}

type turnResult struct {
	payload string   // the stdout marker's payload
	resp    []byte   // the control line's rest after "id "
	extra   []string // other markers and control lines seen
	died    bool     // the interpreter ended
	emitErr error
	ctxErr  error
}

// run sends req and relays output until the turn's markers arrive on
// stdout and stderr (and its control line, if needed).
func (s *session) run(ctx context.Context, req []byte, t turn) turnResult {
	k := &sink{ch: make(chan chunk), done: make(chan struct{})}
	s.mu.Lock()
	s.sink = k
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.sink = nil
		s.mu.Unlock()
		close(k.done)
	}()

	var res turnResult
	if len(req) > 0 {
		if _, err := s.in.Write(req); err != nil {
			res.died = true
			return res
		}
	}
	var outOK, errOK, respOK bool
	respOK = !t.needResp
	var outEOF, errEOF bool
	step := 0
	var timer <-chan time.Time
	ctxDone := ctx.Done()
	dead := s.dead
	var deadline <-chan time.Time
	startInterrupt := func() {
		if timer == nil && t.interrupt != nil {
			t.interrupt(0)
			step = 1
			timer = time.After(escalateAfter)
		}
	}
	for !(outOK && errOK && respOK) {
		if res.died && outEOF && errEOF {
			break
		}
		select {
		case c := <-k.ch:
			switch {
			case c.eof:
				if c.typ == api.EventStdout {
					outEOF = true
				} else {
					errEOF = true
				}
			case c.isMark:
				switch {
				case c.marker == t.id || strings.HasPrefix(c.marker, t.id+":"):
					if c.typ == api.EventStdout {
						outOK, res.payload = true, c.marker
					} else {
						errOK = true
					}
				case !isTurnID(c.marker):
					res.extra = append(res.extra, c.marker)
				}
			case c.typ == "":
				if rest, ok := strings.CutPrefix(string(c.data), t.id+" "); ok && t.needResp {
					respOK, res.resp = true, []byte(rest)
				} else if !isTurnLine(c.data) {
					res.extra = append(res.extra, string(c.data))
				}
			default:
				if t.emit != nil {
					if err := t.emit(api.Event{Type: c.typ, Data: c.data}); err != nil {
						res.emitErr = err
						t.emit = nil
						startInterrupt()
					}
				}
			}
		case <-ctxDone:
			ctxDone = nil
			res.ctxErr = ctx.Err()
			startInterrupt()
		case <-timer:
			t.interrupt(step)
			step++
			timer = time.After(escalateAfter)
		case <-dead:
			dead = nil
			res.died = true
			// Let the readers deliver what the interpreter wrote last.
			deadline = time.After(time.Second)
		case <-deadline:
			return res
		}
	}
	return res
}

// isTurnID reports whether a marker payload belongs to some turn (an
// earlier one's late marker), as opposed to an out-of-band marker.
func isTurnID(m string) bool {
	id, _, _ := strings.Cut(m, ":")
	return id != "" && strings.Trim(id, "0123456789") == ""
}

func isTurnLine(b []byte) bool {
	id, _, ok := strings.Cut(string(b), " ")
	return ok && isTurnID(id)
}

func sysProcAttr(o kernel.Options) *syscall.SysProcAttr {
	sys := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 && (o.UID != 0 || o.GID != 0) {
		sys.Credential = &syscall.Credential{Uid: o.UID, Gid: o.GID, Groups: []uint32{}}
	}
	return sys
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath finds an executable on the child's PATH (falling back to the
// agent's), since the interpreter runs with the context's environment.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath(file)
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", file, err)
	}
	return p, nil
}

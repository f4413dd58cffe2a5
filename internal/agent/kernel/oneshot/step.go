package oneshot

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// drainAfterExit bounds how long output is read after the step exited
// (its leftover background processes are killed at the exit).
const drainAfterExit = 2 * time.Second

// wrapper runs the step and writes its exit status to fd 3. The status
// comes over a pipe, not from wait4, because the agent (PID 1) may reap
// the wrapper itself before we could; the wrapper's own child is reaped
// by the wrapper.
const wrapper = `"$@" 3>&-; echo $? >&3`

type status struct {
	code    int
	missing string // the command was not found
}

type piece struct {
	typ  api.EventType
	data []byte
	eof  bool
}

// step runs argv in dir in its own process group as the kernel's user,
// streams its output to emit and returns its exit status. ctx done kills
// the group.
func (k *Kernel) step(ctx context.Context, dir string, env, argv []string, emit func(api.Event) error) (status, error) {
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, ok := lookPath(path, getenv(env, "PATH"))
		if !ok {
			return status{missing: path}, nil
		}
		path = p
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return status{}, fmt.Errorf("creating pipe: %w", err)
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return status{}, fmt.Errorf("creating pipe: %w", err)
	}
	defer errR.Close()
	rcR, rcW, err := os.Pipe()
	if err != nil {
		outW.Close()
		errW.Close()
		return status{}, fmt.Errorf("creating pipe: %w", err)
	}
	defer rcR.Close()

	cmd := exec.Command("/bin/sh", append([]string{"-c", wrapper, "kiln-" + k.lang, path}, argv[1:]...)...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = []*os.File{rcW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 && (k.opts.UID != 0 || k.opts.GID != 0) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: k.opts.UID, Gid: k.opts.GID, Groups: []uint32{}}
	}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	rcW.Close()
	if err != nil {
		return status{}, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	pgid := cmd.Process.Pid
	go cmd.Wait() // reap it if nobody else does; the status comes over rcR
	k.smu.Lock()
	k.pgid = pgid
	k.smu.Unlock()
	kill := func() { syscall.Kill(-pgid, syscall.SIGKILL) }
	defer func() {
		kill()
		k.smu.Lock()
		k.pgid = 0
		k.smu.Unlock()
	}()

	pieces := make(chan piece)
	stop := make(chan struct{})
	defer close(stop)
	read := func(f *os.File, typ api.EventType) {
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				select {
				case pieces <- piece{typ: typ, data: append([]byte(nil), buf[:n]...)}:
				case <-stop:
					return
				}
			}
			if err != nil {
				select {
				case pieces <- piece{typ: typ, eof: true}:
				case <-stop:
				}
				return
			}
		}
	}
	go read(outR, api.EventStdout)
	go read(errR, api.EventStderr)
	rcCh := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(rcR, 64))
		rcCh <- strings.TrimSpace(string(b))
	}()

	var rc string
	gotRC := false
	eofs := 0
	ctxDone := ctx.Done()
	for eofs < 2 || !gotRC {
		select {
		case p := <-pieces:
			if p.eof {
				eofs++
				continue
			}
			if err := emit(api.Event{Type: p.typ, Data: p.data}); err != nil {
				return status{}, fmt.Errorf("emitting event: %w", err)
			}
		case rc = <-rcCh:
			gotRC = true
			// Leftover background processes must not hold the pipes.
			kill()
			deadline := time.Now().Add(drainAfterExit)
			outR.SetReadDeadline(deadline)
			errR.SetReadDeadline(deadline)
		case <-ctxDone:
			ctxDone = nil
			kill()
		}
	}
	if ctx.Err() != nil {
		return status{}, ctx.Err()
	}
	code, err := strconv.Atoi(rc)
	if err != nil {
		// No status: the wrapper was killed (Interrupt).
		return status{code: 128 + int(syscall.SIGKILL)}, nil
	}
	if code == 127 && argv[0] != path { // not found after all (e.g. a broken symlink)
		if _, err := os.Stat(path); err != nil {
			return status{missing: argv[0]}, nil
		}
	}
	return status{code: code}, nil
}

// lookPath finds an executable on the step's PATH.
func lookPath(file, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

package sudo

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// forwardedSignals are the signals the client passes on to its command
// (which is not in the terminal's foreground process group): ^C, ^\, a
// hang-up, a kill through the API of a process group that holds the
// client, a resized terminal.
var forwardedSignals = []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGHUP,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

func forwarded(sig syscall.Signal) bool { return slices.Contains(forwardedSignals, sig) }

// Main is the sudo client: it runs args (sudo's, without argv[0])
// through the broker at SocketPath and returns the exit code.
func Main(args []string) int {
	code, err := run(SocketPath, args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sudo:", err)
		return 1
	}
	return code
}

// run sends the request to the broker at path, forwards signals until
// the reply, and returns the command's exit code.
func run(path string, args []string) (int, error) {
	conn, err := net.DialTimeout("unix", path, 10*time.Second)
	if err != nil {
		return 1, fmt.Errorf("cannot reach the sandbox agent's sudo broker: %w", err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "/"
	}
	body, err := json.Marshal(request{Args: args, Cwd: cwd, Env: os.Environ()})
	if err != nil {
		return 1, err
	}
	if len(body) > maxRequest {
		return 1, errors.New("the arguments and environment are too large")
	}
	// The command gets the client's stdio with the request and may write
	// before the reply: catch the signals first, or one sent after its
	// first output (^C) could kill the client by default.
	sigs := make(chan os.Signal, 8)
	for _, s := range forwardedSignals {
		signal.Notify(sigs, s)
	}
	defer signal.Stop(sigs)
	msg := frame(body)
	n, _, err := c.WriteMsgUnix(msg, unix.UnixRights(stdio()...), nil)
	if err == nil && n < len(msg) {
		_, err = c.Write(msg[n:])
	}
	if err != nil {
		return 1, fmt.Errorf("sending the command to the sandbox agent: %w", err)
	}
	go func() {
		for s := range sigs {
			_ = writeFrame(c, clientMsg{Signal: int(s.(syscall.Signal))})
		}
	}()
	var rep reply
	if err := readFrame(c, nil, maxFrame, &rep); err != nil {
		return 1, fmt.Errorf("lost the connection to the sandbox agent: %w", err)
	}
	if rep.Error != "" {
		return 1, errors.New(rep.Error)
	}
	return rep.Exit, nil
}

// stdio is the client's stdin, stdout and stderr, /dev/null for any
// that is closed.
func stdio() []int {
	fds := []int{0, 1, 2}
	for i, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			if null, err := unix.Open(os.DevNull, unix.O_RDWR, 0); err == nil {
				fds[i] = null
			}
		}
	}
	return fds
}

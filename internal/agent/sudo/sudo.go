// Package sudo is Kiln's own sudo: a broker that the agent (root, PID 1)
// serves on a unix socket inside the sandbox, and the client that the
// agent's binary becomes when it runs as "sudo" (argv[0]).
//
// gVisor ignores set-user-ID bits (google/gvisor#212), so the templates'
// setuid /usr/bin/sudo cannot make `user` root under runsc. The agent is
// root already: the client sends it its argv, working directory,
// environment and, as SCM_RIGHTS, its stdin, stdout and stderr; the
// broker checks who asks (SO_PEERCRED) against the sandbox's policy (see
// Allowed), starts the command as root (or -u USER) with those
// descriptors, forwards the signals the client gets, and answers with the
// exit status (a signal as 128+n), which the client exits with. When the
// connection drops the command's process group is killed. The broker
// treats every caller as hostile: messages are bounded, the request has a
// deadline, and a panic ends one connection, never the agent.
//
// The sandbox is the security boundary and the API already runs commands
// as root on request, so the broker grants nothing a caller of the API
// does not have (docs/security.md).
package sudo

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Name is the client's name: the agent's binary dispatches on it.
const Name = "sudo"

// SocketPath is where the broker listens in a sandbox: /dev is a tmpfs
// of every sandbox (never captured into a template's layers), SocketDir
// is root's and 0755, the socket 0666.
const (
	SocketDir  = "/dev/kiln"
	SocketPath = SocketDir + "/sudo.sock"
)

// PolicyFile is the sudoers rule Kiln writes for `user` in every template
// that has sudo (internal/template): while it exists, any uid of the
// sandbox may use the broker; without it only root may.
const PolicyFile = "/etc/sudoers.d/kiln-user"

// Bounds on what a caller may send.
const (
	// maxRequest bounds the request (argv and environment; the kernel's
	// own limit for both is about 2 MiB).
	maxRequest = 4 << 20
	// maxFrame bounds every other message either way.
	maxFrame = 4 << 10
)

// request is the client's first message; its descriptors (stdin, stdout,
// stderr) travel with its first byte.
type request struct {
	Args []string `json:"args"` // sudo's arguments, without argv[0]
	Cwd  string   `json:"cwd"`
	Env  []string `json:"env"`
}

// clientMsg follows the request: a signal the client got, for the
// command.
type clientMsg struct {
	Signal int `json:"signal"`
}

// reply is the broker's last message: the command's exit status, or why
// it did not run (the client prints "sudo: " + Error and exits 1).
type reply struct {
	Exit  int    `json:"exit"`
	Error string `json:"error,omitempty"`
}

// writeFrame sends v as a 4-byte big-endian length and its JSON.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(frame(b))
	return err
}

// frame prefixes b with its length.
func frame(b []byte) []byte {
	out := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(out, uint32(len(b)))
	return append(out, b...)
}

// errTooLarge is a frame over its limit.
var errTooLarge = errors.New("message too large")

// readFrame reads one frame of at most limit bytes into v; head holds
// bytes of it already read (at most its 4-byte length).
func readFrame(r io.Reader, head []byte, limit int, v any) error {
	var n [4]byte
	copy(n[:], head)
	if _, err := io.ReadFull(r, n[len(head):]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > uint32(limit) {
		return fmt.Errorf("%w (%d bytes, at most %d)", errTooLarge, size, limit)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding message: %w", err)
	}
	return nil
}

// LinkDir is where the agent links the client too: first on the PATH
// that login shells get from Debian's /etc/profile (E2B's SDKs run every
// command with `bash -l`, which resets PATH) and before /usr/bin on
// every usual one.
const LinkDir = "/usr/local/bin"

// Link makes dir/sudo a symbolic link to client, unless dir/sudo exists
// (a template's own, or the link of an earlier start); it reports
// whether it made one.
func Link(dir, client string) (bool, error) {
	link := filepath.Join(dir, Name)
	if _, err := os.Lstat(link); err == nil || !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	if err := os.Symlink(client, link); err != nil && !errors.Is(err, os.ErrExist) {
		return false, err
	}
	return true, nil
}

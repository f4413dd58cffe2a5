package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns` keeps named network namespaces.
const netnsDir = "/run/netns"

// NSPath is the path of the named network namespace name.
func NSPath(name string) string { return filepath.Join(netnsDir, name) }

// ipCmd runs `ip [-n ns] -batch -` with one command per line of script.
func ipCmd(ctx context.Context, ns string, script ...string) error {
	args := []string{"-batch", "-"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	return runCmd(ctx, strings.Join(script, "\n")+"\n", "ip", args...)
}

// nsExec runs name args inside network namespace ns ("" is ours) with
// stdin, through nsenter (no mount namespace games, unlike `ip netns
// exec`).
func nsExec(ctx context.Context, ns, stdin, name string, args ...string) error {
	if ns != "" {
		args = append([]string{"--net=" + NSPath(ns), "--", name}, args...)
		name = "nsenter"
	}
	return runCmd(ctx, stdin, name, args...)
}

// nsOutput is nsExec returning stdout.
func nsOutput(ctx context.Context, ns, name string, args ...string) ([]byte, error) {
	if ns != "" {
		args = append([]string{"--net=" + NSPath(ns), "--", name}, args...)
		name = "nsenter"
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	// None of these commands leaves a child holding its pipes: WaitDelay
	// only bounds the copying of its output after it exits, which a
	// loaded host can take a while to schedule.
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

func runCmd(ctx context.Context, stdin, name string, args ...string) error {
	var errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stderr = &errb
	cmd.WaitDelay = 30 * time.Second // see nsOutput
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		// It exited with status 0; only copying its stdin or stderr was
		// still unfinished (CI 17: "ip -batch -" under a load of 100).
		err = nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return nil
}

// addNS creates a named network namespace; an existing one is an error.
func addNS(ctx context.Context, name string) error {
	return runCmd(ctx, "", "ip", "netns", "add", name)
}

// delNS removes a named network namespace; a missing one is fine. Its
// interfaces go with it (a veth's peer too).
func delNS(ctx context.Context, name string) error {
	if _, err := os.Stat(NSPath(name)); os.IsNotExist(err) {
		return nil
	}
	return runCmd(ctx, "", "ip", "netns", "del", name)
}

// inNS runs f on an OS thread switched into network namespace ns ("" runs
// f as is). Sockets created in f stay in ns for their lifetime. If the
// thread cannot be switched back, it is never unlocked, so Go discards it.
func inNS(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	target, err := os.Open(NSPath(ns))
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer target.Close()
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening own network namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %s: %w", ns, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leaving network namespace %s: %w", ns, err) // thread stays locked: discarded
	}
	runtime.UnlockOSThread()
	return ferr
}

// DialIn opens a TCP or UDP connection from network namespace ns.
func DialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// ListenIn listens on addr (tcp) in network namespace ns.
func ListenIn(ns, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNS(ns, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacketIn listens on addr (udp) in network namespace ns.
func ListenPacketIn(ns, network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := inNS(ns, func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	return l, err
}

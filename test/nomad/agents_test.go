package nomad_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nomadBin is where scripts/install-nomad.sh installs Nomad.
const nomadBin = "/usr/local/lib/kiln/nomad"

// installNomad runs scripts/install-nomad.sh (a no-op once the pinned
// Nomad is installed) and returns how long it took.
func installNomad(t *testing.T, repo string) time.Duration {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(filepath.Join(repo, "scripts", "install-nomad.sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("installing Nomad: %v\n%s", err, tail(out, 4000))
	}
	return time.Since(start)
}

// agent is one nomad agent process.
type agent struct {
	name   string
	http   string // http://127.0.0.1:port
	rpc    int
	serf   int
	dir    string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// nomadCluster is 3 servers and 2 clients on 127.0.0.1.
type nomadCluster struct {
	t       *testing.T
	root    string // everything of the cluster lives below
	servers []*agent
	clients []*agent
}

// freePorts returns n loopback ports free at the time, all distinct.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// common is every agent's configuration: loopback only, no update check,
// no cloud or Consul/Vault fingerprinting (their probes would leave the
// machine).
const common = `
bind_addr = "127.0.0.1"
log_level = "WARN"
disable_update_check = true
advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}
consul {
  auto_advertise   = false
  server_auto_join = false
  client_auto_join = false
}
vault {
  enabled = false
}
`

// startNomad starts the servers and clients and waits until a leader is
// elected and both clients are ready with raw_exec.
func startNomad(t *testing.T, root string) *nomadCluster {
	t.Helper()
	c := &nomadCluster{t: t, root: root}
	// Whatever fails from here on, no agent or task outlives the test
	// (the full teardown, registered later, runs first).
	t.Cleanup(func() { c.stop(); c.removeLeft() })
	ports := freePorts(t, 5*3)
	var joins, rpcs []string
	for i := range 3 {
		joins = append(joins, fmt.Sprintf(`"127.0.0.1:%d"`, ports[i*3+2]))
		rpcs = append(rpcs, fmt.Sprintf(`"127.0.0.1:%d"`, ports[i*3+1]))
	}
	for i := range 5 {
		a := &agent{dir: filepath.Join(root, "nomad", fmt.Sprint(i)), http: fmt.Sprintf("http://127.0.0.1:%d", ports[i*3]),
			rpc: ports[i*3+1], serf: ports[i*3+2], exited: make(chan struct{})}
		var role string
		if i < 3 {
			a.name = fmt.Sprintf("server-%d", i+1)
			role = fmt.Sprintf(`
server {
  enabled          = true
  bootstrap_expect = 3
  server_join {
    retry_join     = [%s]
    retry_interval = "1s"
  }
}
client { enabled = false }
`, strings.Join(joins, ", "))
			c.servers = append(c.servers, a)
		} else {
			n := i - 2
			a.name = fmt.Sprintf("client-%d", n)
			// Disjoint dynamic port ranges: both clients share 127.0.0.1.
			role = fmt.Sprintf(`
server { enabled = false }
client {
  enabled           = true
  servers           = [%s]
  network_interface = "lo"
  min_dynamic_port  = %d
  max_dynamic_port  = %d
  options = {
    "driver.allowlist"     = "raw_exec"
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean,consul,vault"
  }
}
plugin "raw_exec" {
  config { enabled = true }
}
`, strings.Join(rpcs, ", "), 21000+1000*n, 21999+1000*n)
			c.clients = append(c.clients, a)
		}
		conf := fmt.Sprintf("name = %q\ndata_dir = %q\nports {\n  http = %d\n  rpc = %d\n  serf = %d\n}\n%s%s",
			a.name, a.dir, ports[i*3], a.rpc, a.serf, common, role)
		if err := os.MkdirAll(a.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "nomad", a.name+".hcl"), []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		a.log = filepath.Join(root, "nomad", a.name+".log")
		c.start(a)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var leader string
		err := c.get("/v1/status/leader", &leader)
		if err == nil && leader != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Nomad leader: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		var nodes []struct {
			Name, Status string
			Drivers      map[string]struct{ Healthy bool }
		}
		err := c.get("/v1/nodes", &nodes)
		ready := 0
		for _, n := range nodes {
			if n.Status == "ready" && n.Drivers["raw_exec"].Healthy {
				ready++
			}
		}
		if ready == len(c.clients) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("Nomad clients not ready: %+v, %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *nomadCluster) start(a *agent) {
	logf, err := os.Create(a.log)
	if err != nil {
		c.t.Fatal(err)
	}
	a.cmd = exec.Command(nomadBin, "agent", "-config", filepath.Join(c.root, "nomad", a.name+".hcl"))
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	// The marker is inherited by the executors and log monitors a client
	// starts, so removeLeft finds those a killed client left.
	a.cmd.Env = append(os.Environ(), c.marker())
	// Its own process group: a signal to the test's group spares it, and
	// the tasks' executors outlive a client as they would in production.
	// A test binary that dies (a timeout) still takes the agents along.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); logf.Close(); close(a.exited) }()
}

// get decodes a GET of the servers' HTTP API into v.
func (c *nomadCluster) get(path string, v any) error {
	resp, err := http.Get(c.servers[0].http + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// nomad runs the nomad CLI against the servers.
func (c *nomadCluster) nomad(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, nomadBin, args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+c.servers[0].http)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("nomad %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// kill9 kills agent a at once, as a crash would.
func (c *nomadCluster) kill9(a *agent) {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
}

// stop stops every agent still running: clients first, then servers.
func (c *nomadCluster) stop() {
	for _, as := range [][]*agent{c.clients, c.servers} {
		for _, a := range as {
			if a.cmd == nil || a.cmd.Process == nil {
				continue
			}
			_ = a.cmd.Process.Signal(syscall.SIGINT)
		}
		for _, a := range as {
			if a.cmd == nil || a.cmd.Process == nil {
				continue
			}
			select {
			case <-a.exited:
			case <-time.After(15 * time.Second):
				_ = a.cmd.Process.Kill()
				<-a.exited
			}
		}
	}
}

// removeLeft kills what a client killed with -9 left running (its
// tasks' executors and log monitors, which outlive it, found by the
// marker in their environment) and removes the cgroups of this cluster's
// allocations, then Nomad's parent cgroups if nothing else uses them.
// Nomad 1.10.5 ignores cgroup_parent on cgroups v1: tasks are always
// under /nomad (cpuset: /nomad/share and /nomad/reserve).
func (c *nomadCluster) removeLeft() {
	for _, pid := range procs(nomadBin, "", c.marker()) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	allocs, _ := filepath.Glob(filepath.Join(c.root, "nomad", "*", "alloc", "*"))
	var dirs []string
	for _, a := range allocs {
		for _, pat := range []string{"/sys/fs/cgroup/*/nomad/%s.*", "/sys/fs/cgroup/cpuset/nomad/*/%s.*"} {
			m, _ := filepath.Glob(fmt.Sprintf(pat, filepath.Base(a)))
			dirs = append(dirs, m...)
		}
	}
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// A cgroup empties a moment after its last process is killed.
	for _, d := range dirs {
		for try := 0; ; try++ {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if try == 100 {
				c.t.Errorf("removing cgroup %s: %v", d, err)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/nomad")
	parents = append([]string{"/sys/fs/cgroup/cpuset/nomad/share", "/sys/fs/cgroup/cpuset/nomad/reserve"}, parents...)
	for _, p := range parents {
		// Busy a moment after its children go; busy for good (and
		// left alone) while another Nomad on the machine uses it.
		for try := 0; try < 25; try++ {
			if err := os.Remove(p); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (c *nomadCluster) marker() string { return "KILN_NOMAD_TEST_ROOT=" + c.root }

// unmountBelow detaches every mount under root (a killed node's sandbox
// root filesystems), deepest first, so the temp dir can be removed.
func unmountBelow(t *testing.T, root string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == root || strings.HasPrefix(f[4], root+"/")) {
			mps = append(mps, f[4])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		if err := unix.Unmount(mps[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("unmounting %s: %v", mps[i], err)
		}
	}
}

// procs returns the pids of the processes running exe whose first
// argument is arg0 ("" for any) and whose environment holds every one of
// env.
func procs(exe, arg0 string, env ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || p != exe {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := bytes.Split(cmdline, []byte{0})
		if arg0 != "" && (len(args) < 2 || string(args[1]) != arg0) {
			continue
		}
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		vars := map[string]bool{}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			vars[string(kv)] = true
		}
		all := true
		for _, kv := range env {
			all = all && vars[kv]
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Package pgtest gives tests a real PostgreSQL: the one at
// $KILN_TEST_POSTGRES_URL if set, otherwise a throwaway server started
// from Debian's binaries (apt-get install postgresql) in a temp dir, once
// per test binary, reachable only through a unix socket in that dir (no
// port to collide with, and the distribution's own cluster is left alone).
// Each URL call gets a fresh schema, so tests never see each other's rows.
//
// Without PostgreSQL the tests skip, except under CI=true, where they
// fail: CI must not go green by skipping.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names an existing database to test against instead.
const EnvURL = "KILN_TEST_POSTGRES_URL"

var (
	once    sync.Once
	base    string // URL of the server's admin database
	srv     *server
	skip    string // why there is no PostgreSQL, if there is none
	failure error
	schemas atomic.Int64
)

// Main runs the tests and then stops the server they started, if any.
// Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if srv != nil {
		srv.stop()
	}
	return code
}

// Require skips t (fails it under CI=true) when there is no PostgreSQL
// to test against, starting the throwaway server on first use.
func Require(t testing.TB) {
	t.Helper()
	once.Do(func() {
		if base = os.Getenv(EnvURL); base == "" {
			srv, skip, failure = start(false)
			if srv != nil {
				base = srv.url
			}
		}
	})
	check(t, skip, failure)
}

// check skips t when there is no PostgreSQL (why), failing it instead
// under CI=true, and fails it when the server did not start (err).
func check(t testing.TB, why string, err error) {
	t.Helper()
	switch {
	case why != "" && os.Getenv("CI") == "true":
		t.Fatalf("no PostgreSQL for the tests (CI=true, so not skipping): %s", why)
	case why != "":
		t.Skipf("no PostgreSQL for the tests: %s", why)
	case err != nil:
		t.Fatalf("starting PostgreSQL: %v", err)
	}
}

// URL returns a postgres:// URL whose search_path is a new, empty schema,
// dropped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connecting to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	schema := fmt.Sprintf("kiln_test_%d_%d", os.Getpid(), schemas.Add(1))
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("connecting to drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parsing %s: %v", EnvURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

type server struct {
	dir    string
	url    string
	bin    string
	cred   *syscall.Credential
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	// durable servers commit synchronously (Private).
	durable bool
}

// start initialises and starts a cluster in a temp dir. It returns a
// reason to skip when PostgreSQL is not installed.
func start(durable bool) (*server, string, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err.Error(), nil
	}
	// postgres refuses to run as root: run it as the postgres user the
	// Debian package creates.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, "running as root and no postgres user to run the server as", nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "kiln-pg-")
	if err != nil {
		return nil, "", fmt.Errorf("creating server dir: %w", err)
	}
	s := &server{dir: dir, bin: bin, cred: cred, durable: durable}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			s.stop()
			return nil, "", fmt.Errorf("handing server dir to postgres: %w", err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		s.stop()
		return nil, "", fmt.Errorf("running initdb: %w\n%s", err, out)
	}
	s.url = "postgres:///postgres?" + url.Values{
		"host": {dir}, "user": {"postgres"}, "sslmode": {"disable"},
	}.Encode()
	if err := s.run(); err != nil {
		s.stop()
		return nil, "", err
	}
	return s, "", nil
}

// run starts the server on its data dir and waits until it takes
// connections.
func (s *server) run() error {
	log, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("creating server log: %w", err)
	}
	defer log.Close()
	// Durability settings off: this server holds nothing worth keeping,
	// and the machine does not crash under it. A server that is stopped
	// at once (Stop) must keep what it committed: synchronous commits.
	commit := "off"
	if s.durable {
		commit = "on"
	}
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.dir, "data"), "-k", s.dir,
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit="+commit,
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// Pdeathsig: a test binary that dies still takes its server along.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { _ = s.cmd.Wait(); close(exited) }()
	if err := s.waitReady(); err != nil {
		logs, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
		return fmt.Errorf("%w\n%s", err, logs)
	}
	return nil
}

func (s *server) waitReady() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.url)
		cancel()
		if err == nil {
			return conn.Close(context.Background())
		}
		select {
		case <-s.exited:
			return errors.New("waiting for postgres: it exited")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for postgres: %w", err)
		}
	}
}

// stop shuts the server down (fast mode: SIGINT) and removes its files.
func (s *server) stop() {
	s.halt(syscall.SIGINT)
	_ = os.RemoveAll(s.dir)
}

// halt stops the server, if it runs, with sig (SIGINT: fast shutdown,
// SIGQUIT: immediate, as after a crash) and waits for it.
func (s *server) halt(sig syscall.Signal) {
	if s.exited == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.exited = nil
}

// Server is a PostgreSQL of one test's own, which it may stop and start
// again (a restart drill): same data, same socket, same URL.
type Server struct {
	s *server
}

// Private starts a PostgreSQL server for t alone (skipping t, or failing
// it under CI=true, without PostgreSQL); t's cleanup stops it and removes
// its files. Register it before whatever must still reach it in its own
// cleanup (cleanups run last first).
func Private(t testing.TB) *Server {
	t.Helper()
	srv, why, err := start(true)
	check(t, why, err)
	t.Cleanup(srv.stop)
	return &Server{srv}
}

// URL is the server's postgres:// URL (its postgres database, over its
// unix socket).
func (p *Server) URL() string { return p.s.url }

// Stop stops the server at once, as pg_ctl stop -m immediate does: its
// connections are cut, nothing is shut down cleanly (the next start
// recovers).
func (p *Server) Stop(t testing.TB) {
	t.Helper()
	p.s.halt(syscall.SIGQUIT)
}

// Start starts the stopped server again on the same data and socket, and
// waits until it takes connections.
func (p *Server) Start(t testing.TB) {
	t.Helper()
	if err := p.s.run(); err != nil {
		t.Fatalf("restarting PostgreSQL: %v", err)
	}
}

// binDir finds the directory with initdb and postgres: Debian's newest
// /usr/lib/postgresql/<version>/bin, else wherever PATH has initdb.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	return "", errors.New("postgres is not installed (apt-get install postgresql)")
}

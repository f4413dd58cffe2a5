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
			srv, skip, failure = start()
			if srv != nil {
				base = srv.url
			}
		}
	})
	switch {
	case skip != "" && os.Getenv("CI") == "true":
		t.Fatalf("no PostgreSQL for the tests (CI=true, so not skipping): %s", skip)
	case skip != "":
		t.Skipf("no PostgreSQL for the tests: %s", skip)
	case failure != nil:
		t.Fatalf("starting PostgreSQL: %v", failure)
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
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// start initialises and starts a cluster in a temp dir. It returns a
// reason to skip when PostgreSQL is not installed.
func start() (*server, string, error) {
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
	s := &server{dir: dir}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			s.stop()
			return nil, "", fmt.Errorf("handing server dir to postgres: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		s.stop()
		return nil, "", fmt.Errorf("running initdb: %w\n%s", err, out)
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		s.stop()
		return nil, "", fmt.Errorf("creating server log: %w", err)
	}
	defer log.Close()
	// Durability settings off: this server holds nothing worth keeping.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-k", dir,
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// Pdeathsig: a test binary that dies still takes its server along.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := s.cmd.Start(); err != nil {
		s.stop()
		return nil, "", fmt.Errorf("starting postgres: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	s.url = "postgres:///postgres?" + url.Values{
		"host": {dir}, "user": {"postgres"}, "sslmode": {"disable"},
	}.Encode()
	if err := s.waitReady(); err != nil {
		logs, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		s.stop()
		return nil, "", fmt.Errorf("%w\n%s", err, logs)
	}
	return s, "", nil
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
	if s.exited != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	_ = os.RemoveAll(s.dir)
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

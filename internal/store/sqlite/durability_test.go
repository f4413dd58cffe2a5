package sqlite_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
	"github.com/kiln-sh/kiln/internal/template"
)

// childEnv makes the test binary, re-executed by TestKillDurability, the
// writer that gets killed.
const childEnv = "KILN_STORE_TEST_DURABILITY_DB"

// TestKillDurability is the promise kiln serve makes: a write that
// returned is on disk even if the process is SIGKILLed the next instant.
// A child process writes records and reports each one after PutSandbox,
// CreateKey or PutBuild and PutTag return; it is killed mid-stream, and
// every reported record must be there when the database is reopened.
func TestKillDurability(t *testing.T) {
	if path := os.Getenv(childEnv); path != "" {
		durabilityChild(path)
		return
	}
	path := filepath.Join(t.TempDir(), "kiln.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDurability$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var sandboxes, keys, builds []string
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(sandboxes) < 300 {
		kind, val, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "sandbox":
			sandboxes = append(sandboxes, val)
		case "key":
			keys = append(keys, val)
		case "build":
			builds = append(builds, val)
		}
	}
	// Kill while the child is still writing: it is mid-transaction.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(sandboxes) < 300 {
		t.Fatalf("child acknowledged only %d writes before exiting: %v", len(sandboxes), sc.Err())
	}

	s := open(t, path)
	ctx := context.Background()
	for _, id := range sandboxes {
		if _, err := s.GetSandbox(ctx, sandbox.ID(id)); err != nil {
			t.Errorf("acknowledged sandbox %s lost: %v", id, err)
		}
	}
	for _, h := range keys {
		hash, _ := hex.DecodeString(h)
		if _, err := s.KeyByHash(ctx, hash); err != nil {
			t.Errorf("acknowledged key %s lost: %v", h, err)
		}
	}
	for _, id := range builds {
		if _, err := s.GetBuild(ctx, id); err != nil {
			t.Errorf("acknowledged template build %s lost: %v", id, err)
		}
		if tag, err := s.GetTag(ctx, "key_durable", id, template.DefaultTag); err != nil || tag.BuildID != id {
			t.Errorf("acknowledged template tag %s lost: %+v, %v", id, tag, err)
		}
	}
	if len(builds) == 0 {
		t.Error("child acknowledged no template build")
	}
	t.Logf("%d sandboxes, %d keys and %d template builds acknowledged before SIGKILL, all present",
		len(sandboxes), len(keys), len(builds))
}

// durabilityChild writes until killed (or, orphaned, for a minute at most).
func durabilityChild(path string) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	deadline := time.Now().Add(time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		sb := sandbox.Sandbox{ID: sandbox.ID(fmt.Sprintf("durable%08d", i)), State: sandbox.StateRunning,
			Metadata: map[string]string{"i": fmt.Sprint(i)}, CreatedAt: time.Now()}
		if err := s.PutSandbox(ctx, sb); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stdout, "sandbox", sb.ID) // os.Stdout is unbuffered
		if i%10 == 0 {
			k, _ := apikey.New(fmt.Sprint(i), false)
			if err := s.CreateKey(ctx, k); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Fprintln(os.Stdout, "key", hex.EncodeToString(k.Hash))
			id := fmt.Sprintf("bld%08d", i)
			b := template.BuildRecord{ID: id, Template: id, Owner: "key_durable", Status: template.BuildReady,
				Layers: []string{"sha256:" + id}, Step: -1, CreatedAt: time.Now(), FinishedAt: time.Now()}
			if err := s.PutBuild(ctx, b); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			tag := template.TagRecord{Owner: "key_durable", Name: id, Tag: template.DefaultTag, BuildID: id, UpdatedAt: time.Now()}
			if err := s.PutTag(ctx, tag); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			fmt.Fprintln(os.Stdout, "build", id)
		}
	}
	os.Exit(0)
}

package builder_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/template"
)

// A pool of a custom template (kiln serve --pool site=1, and a tagged
// one: site:v2=1) holds sandboxes
// restored from its warm snapshot: a create claims one that answers on the
// start command's port at once. Another key cannot get the private
// template (nor its pooled sandboxes). A new build of the name drains the
// pool of the old build and refills it from the new one, while the
// sandbox claimed earlier keeps its build.
func TestPoolOfCustomTemplate(t *testing.T) {
	e := newEnv(t, "runsc")
	e.cfg.Images, e.cfg.ReadyTimeout = e.im, time.Minute
	e.b = e.open()
	spec := func(page string) api.TemplateSpec {
		return api.TemplateSpec{From: api.TemplateBase{Template: "base"},
			Steps:    []api.TemplateStep{{Type: api.StepRun, Args: []string{"mkdir -p /srv/www && echo " + page + " > /srv/www/index.html"}}},
			StartCmd: "cd /srv/www && exec python3 -m http.server 8080",
			ReadyCmd: "echo > /dev/tcp/127.0.0.1/8080"}
	}
	first, log := e.build("web", "site", spec("page-v1"))
	if first.Status != template.BuildReady {
		t.Fatalf("build: %s %q%s", first.Status, first.Reason, lines(log))
	}
	tagged, log := e.build("web", "site:v2", spec("page-tagged"))
	if tagged.Status != template.BuildReady {
		t.Fatalf("build of site:v2: %s %q%s", tagged.Status, tagged.Reason, lines(log))
	}
	pools, err := config.ParsePools("site=1,site:v2=1") // kiln serve --pool
	if err != nil {
		t.Fatal(err)
	}
	e.im.StartPools(pools)
	t.Cleanup(e.im.StopPools)
	waitPoolBuild(t, e.im, "site", first.ID)
	waitPoolBuild(t, e.im, "site:v2", tagged.ID)

	ctx := context.Background()
	claimRef := func(ref, want string) *sandboxtest.Box {
		t.Helper()
		before := poolStat(e.im, ref).Hits
		box := sandboxtest.Create(t, e.m, sandbox.CreateOptions{Template: ref, Owner: "web"})
		if hits := poolStat(e.im, ref).Hits; hits != before+1 {
			t.Errorf("create of %s: pool hits %d → %d, want a claim", ref, before, hits)
		}
		// One request, no retry: the server is up the moment the create returns.
		if got := httpGet(box); got != want {
			t.Errorf("a sandbox from the pool answers %q on :8080, want %q", got, want)
		}
		return box
	}
	claim := func(want string) *sandboxtest.Box { t.Helper(); return claimRef("site", want) }
	box1 := claim("page-v1")
	claimRef("site:v2", "page-tagged")
	waitPoolBuild(t, e.im, "site", first.ID) // refilled

	if _, err := e.m.Create(ctx, sandbox.CreateOptions{Template: "site", Owner: "eve"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another key's create of the private template: %v, want not found", err)
	}

	second, log := e.build("web", "site", spec("page-v2"))
	if second.Status != template.BuildReady {
		t.Fatalf("rebuild: %s %q%s", second.Status, second.Reason, lines(log))
	}
	waitPoolBuild(t, e.im, "site", second.ID)
	claim("page-v2")
	if got := httpGet(box1); got != "page-v1" {
		t.Errorf("the sandbox claimed before the rebuild now answers %q", got)
	}
}

// httpGet fetches / from port 8080 inside the sandbox, once.
func httpGet(box *sandboxtest.Box) string {
	r := box.Exec(wire.ExecParams{Args: []string{"bash", "-c",
		`exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /index.html HTTP/1.0\r\n\r\n' >&3 && cat <&3 | tail -n 1`}})
	return strings.TrimSpace(r.Stdout)
}

func poolStat(im *sandbox.Images, name string) sandbox.PoolStat {
	for _, s := range im.PoolStats() {
		if s.Template == name {
			return s
		}
	}
	return sandbox.PoolStat{}
}

// waitPoolBuild waits (3 minutes at most) until the named pool holds one
// ready sandbox, of build id, and nothing else.
func waitPoolBuild(t *testing.T, im *sandbox.Images, name, id string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s := poolStat(im, name)
		if s.Build == id && s.Ready == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never held one sandbox of build %s: %+v", name, id, im.PoolStats())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

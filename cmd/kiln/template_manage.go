package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/progress"
	"github.com/kiln-sh/kiln/internal/template"
)

const templateListUsage = `Usage: kiln template ls [--json]
       kiln template ls --local

Lists the templates this key can use: its own (an admin key: everyone's),
the public ones, and the built-ins, with the build each tag points at.
--local lists instead the built-in templates built on this host
(KILN_DATA_DIR), with no server.

Example:
  kiln template ls
  NAME              TAG      BUILD         STATUS  PUBLIC  UPDATED
  base              default  built-in      ready   yes     -
  cowsay            default  tb4k2m9x0q1w  ready   no      3m
`

const templateGetUsage = `Usage: kiln template get REF [--json]

Shows a template (REF is name or name:tag) and the build its tag points
at: its status, steps, start and ready commands.

Example:
  kiln template get web:v2
`

const templateRemoveUsage = `Usage: kiln template rm REF...

Deletes templates: name:tag removes that tag, a bare name every tag of the
template. Sandboxes running from it keep their build; its layers are
collected once nothing uses them.

Examples:
  kiln template rm web:v1
  kiln template rm web
`

const templateTagUsage = `Usage: kiln template tag NAME:TAG BUILD_ID

Points NAME:TAG at a ready build of the template (a new tag, or a moved
one, e.g. to roll back). 'kiln template builds NAME' lists the builds.

Example:
  kiln template tag web:stable tb4k2m9x0q1w
`

const templateUntagUsage = `Usage: kiln template untag NAME:TAG

Removes a tag; the build stays as long as another tag or a sandbox uses it.

Example:
  kiln template untag web:v1
`

const templatePushUsage = `Usage: kiln template push REF IMAGE [--registry-user USER] [--json]

Pushes the template's build (REF: name or name:tag) to a registry as an
OCI image: its layers, and its env, user, working directory and start
command as the image's config. Docker, other OCI tools and other Kiln
servers (FROM IMAGE, --from-image) can then pull it. The server makes the
push; the password is read from KILN_REGISTRY_PASSWORD (never a flag).

Examples:
  kiln template push web:v1 registry.example.com/team/web:v1
  KILN_REGISTRY_PASSWORD=… kiln template push web registry.example.com/team/web --registry-user ci
`

const templatePublishUsage = `Usage: kiln template publish NAME
       kiln template unpublish NAME

publish lets every key of the server create sandboxes from the template
(only yours can change it); unpublish makes it yours alone again.
`

const templateBuildsUsage = `Usage: kiln template builds [NAME] [--limit N] [--json]

Lists builds, newest first: all of this key's, or those of template NAME.

Example:
  kiln template builds web
`

const templateLogsUsage = `Usage: kiln template logs BUILD_ID [-f] [--progress auto|plain|tty] [--json]

Prints a build's log. -f follows it until the build ends, then exits 1 if
the build failed. --json prints the log entries as they are (NDJSON:
time, level, step, message, output).

Examples:
  kiln template logs tb4k2m9x0q1w
  kiln template logs -f tb4k2m9x0q1w
`

func (r *remote) templateList(ctx context.Context, cfg config.Config, args []string) error {
	c := r.command("template ls", templateListUsage)
	local := c.fs.Bool("local", false, "list the built-in templates built on this host (no server)")
	c.fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "with --local: the data directory")
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	if *local {
		return r.listLocal(cfg)
	}
	ts, err := r.c.ListTemplates(ctx)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(ts)
	}
	tw := r.table()
	fmt.Fprintln(tw, "NAME\tTAG\tBUILD\tSTATUS\tPUBLIC\tUPDATED")
	now := time.Now()
	for _, t := range ts {
		build, status, updated := t.BuildID, "ready", "-"
		if t.Builtin {
			build = "built-in"
		}
		if t.Build != nil {
			status = t.Build.Status
		}
		if !t.UpdatedAt.IsZero() {
			updated = age(now.Sub(t.UpdatedAt))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Tag, build, status, yesNo(t.Public || t.Builtin), updated)
	}
	return tw.Flush()
}

func (r *remote) templateGet(ctx context.Context, args []string) error {
	c := r.command("template get", templateGetUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	t, err := r.c.GetTemplate(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(t)
	}
	tw := r.table()
	fmt.Fprintf(tw, "name:\t%s:%s\n", t.Name, t.Tag)
	if t.Builtin {
		fmt.Fprintln(tw, "build:\tbuilt-in")
	} else {
		fmt.Fprintf(tw, "build:\t%s\n", t.BuildID)
	}
	if t.Owner != "" {
		fmt.Fprintf(tw, "owner:\t%s\n", t.Owner)
	}
	fmt.Fprintf(tw, "public:\t%s\n", yesNo(t.Public || t.Builtin))
	if !t.UpdatedAt.IsZero() {
		fmt.Fprintf(tw, "updated:\t%s\n", t.UpdatedAt.Local().Format(time.DateTime))
	}
	if b := t.Build; b != nil {
		fmt.Fprintf(tw, "status:\t%s\n", buildSummary(b))
		if b.Spec != nil {
			fmt.Fprintf(tw, "from:\t%s\n", fromString(b.Spec.From))
			if b.Spec.StartCmd != "" {
				fmt.Fprintf(tw, "start:\t%s\n", progress.Sanitize(b.Spec.StartCmd))
				fmt.Fprintf(tw, "ready:\t%s\n", progress.Sanitize(b.Spec.ReadyCmd))
			}
		}
		if b.Reason != "" {
			fmt.Fprintf(tw, "reason:\t%s\n", progress.Sanitize(b.Reason))
		}
	}
	return tw.Flush()
}

// buildSummary is a build's status with its counts.
func buildSummary(b *api.TemplateBuild) string {
	s := fmt.Sprintf("%s (%d steps, %d cached", b.Status, b.Steps, b.CachedSteps)
	if b.Layers > 0 {
		s += fmt.Sprintf(", %d layers", b.Layers)
	}
	if b.Warm {
		s += ", warm"
	}
	return s + ")"
}

func fromString(f api.TemplateBase) string {
	switch {
	case f.Image != "":
		return "image " + f.Image
	case f.Archive != "":
		return "image archive " + f.Archive
	}
	return "template " + f.Template
}

func yesNo(b bool) string { return map[bool]string{true: "yes", false: "no"}[b] }

func (r *remote) templateRemove(ctx context.Context, args []string) error {
	c := r.command("template rm", templateRemoveUsage)
	pos, err := c.parse(args, 1, -1)
	if err != nil {
		return err
	}
	for _, ref := range pos {
		if err := r.c.DeleteTemplate(ctx, ref); err != nil {
			return err
		}
		if !*c.json {
			fmt.Fprintln(r.stdout, ref)
		}
	}
	return nil
}

// nameTag splits a NAME:TAG argument, which must have both.
func nameTag(c *command, ref string) (string, string, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil || !strings.Contains(ref, ":") {
		return "", "", c.usageError(fmt.Sprintf("want NAME:TAG, got %q", ref))
	}
	return name, tag, nil
}

func (r *remote) templateTag(ctx context.Context, args []string) error {
	c := r.command("template tag", templateTagUsage)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	name, tag, err := nameTag(c, pos[0])
	if err != nil {
		return err
	}
	t, err := r.c.TagTemplate(ctx, name, tag, pos[1])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(t)
	}
	fmt.Fprintf(r.stdout, "%s:%s -> %s\n", t.Name, t.Tag, t.BuildID)
	return nil
}

func (r *remote) templateUntag(ctx context.Context, args []string) error {
	c := r.command("template untag", templateUntagUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	name, tag, err := nameTag(c, pos[0])
	if err != nil {
		return err
	}
	if err := r.c.UntagTemplate(ctx, name, tag); err != nil {
		return err
	}
	if !*c.json {
		fmt.Fprintf(r.stdout, "%s:%s\n", name, tag)
	}
	return nil
}

func (r *remote) templatePush(ctx context.Context, args []string) error {
	c := r.command("template push", templatePushUsage)
	user := c.fs.String("registry-user", "", "log in to the registry as `USER`; the password is read from KILN_REGISTRY_PASSWORD")
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	req := api.TemplatePushRequest{Image: pos[1]}
	if pass := os.Getenv("KILN_REGISTRY_PASSWORD"); *user != "" || pass != "" {
		req.Registry = &api.RegistryAuth{Username: *user, Password: pass}
	}
	res, err := r.c.PushTemplate(ctx, pos[0], req)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(res)
	}
	fmt.Fprintf(r.stdout, "%s@%s\n", res.Image, res.Digest)
	return nil
}

func (r *remote) templatePublish(ctx context.Context, verb string, public bool, args []string) error {
	c := r.command("template "+verb, templatePublishUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	t, err := r.c.SetTemplatePublic(ctx, pos[0], public)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(t)
	}
	fmt.Fprintf(r.stdout, "%s public: %s\n", t.Name, yesNo(t.Public))
	return nil
}

func (r *remote) templateBuilds(ctx context.Context, args []string) error {
	c := r.command("template builds", templateBuildsUsage)
	limit := c.fs.Int("limit", 20, "show at most `N` builds")
	pos, err := c.parse(args, 0, 1)
	if err != nil {
		return err
	}
	name := ""
	if len(pos) == 1 {
		name = pos[0]
	}
	bs, err := r.c.TemplateBuilds(ctx, name, *limit)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(bs)
	}
	tw := r.table()
	fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATUS\tSTEPS\tCACHED\tAGE\tTOOK")
	now := time.Now()
	for _, b := range bs {
		took := "-"
		if b.StartedAt != nil && b.FinishedAt != nil {
			took = b.FinishedAt.Sub(*b.StartedAt).Round(100 * time.Millisecond).String()
		}
		ref := b.Template
		if b.Tag != "" {
			ref += ":" + b.Tag
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", b.ID, ref, b.Status, b.Steps, b.CachedSteps, age(now.Sub(b.CreatedAt)), took)
	}
	return tw.Flush()
}

func (r *remote) templateLogs(ctx context.Context, args []string) error {
	c := r.command("template logs", templateLogsUsage)
	follow := c.fs.Bool("f", false, "follow the log until the build ends")
	c.fs.BoolVar(follow, "follow", false, "the same as -f")
	mode := c.fs.String("progress", "auto", "with -f: plain, tty (live), or auto (live on a terminal)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	id := pos[0]
	if *c.json {
		enc := json.NewEncoder(r.stdout)
		return r.c.TemplateBuildLogs(ctx, id, 0, *follow, func(e api.TemplateLogEntry) error { return enc.Encode(e) })
	}
	if *mode != "auto" && *mode != "plain" && *mode != "tty" {
		return c.usageError(fmt.Sprintf("--progress %q: want auto, plain or tty", *mode))
	}
	if *follow {
		b, err := r.follow(ctx, id, *mode, r.stdout)
		if err != nil {
			return err
		}
		return r.buildExit(b)
	}
	d := progress.New(r.stdout, progress.Options{})
	defer d.Close()
	return r.c.TemplateBuildLogs(ctx, id, 0, false, func(e api.TemplateLogEntry) error {
		d.Add(e)
		return nil
	})
}

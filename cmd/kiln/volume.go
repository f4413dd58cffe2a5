package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
)

const volumeUsage = `Usage:
  kiln volume create NAME [--size 1G]   create a persistent volume
  kiln volume ls                        list your volumes: NAME ID SIZE AGE
  kiln volume rm NAME|ID...             delete volumes and their data

Mount volumes at create: 'kiln sandbox create --volume NAME:/data' (add
':ro' for read-only). A volume outlives its sandboxes, and several
sandboxes can mount one at once. See docs/volumes.md.
` + remoteHelp

func volumeCmd(ctx context.Context, args []string) error { return newRemote().volume(ctx, args) }

func (r *remote) volume(ctx context.Context, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"create": r.volumeCreate, "ls": r.volumeList, "list": r.volumeList, "rm": r.volumeRemove, "delete": r.volumeRemove,
	}
	return r.dispatch(ctx, "volume", volumeUsage, cmds, args)
}

func (r *remote) volumeCreate(ctx context.Context, args []string) error {
	c := r.command("volume create", volumeUsage)
	var size int64
	c.fs.Var(sizeFlag{&size}, "size", "what it may hold, e.g. 10G (default: the server's, 1G)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	v, err := r.c.CreateVolume(ctx, pos[0], size)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(v)
	}
	fmt.Fprintf(r.stdout, "%s %s (%s)\n", v.Name, v.ID, bytesString(v.SizeBytes))
	return nil
}

func (r *remote) volumeList(ctx context.Context, args []string) error {
	c := r.command("volume ls", volumeUsage)
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	l, err := r.c.ListVolumes(ctx)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(l.Volumes)
	}
	tw := r.table()
	fmt.Fprintln(tw, "NAME\tID\tSIZE\tAGE")
	now := time.Now()
	for _, v := range l.Volumes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, v.ID, bytesString(v.SizeBytes), age(now.Sub(v.CreatedAt)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "%d volumes, %s\n", len(l.Volumes), bytesString(l.TotalBytes))
	return nil
}

func (r *remote) volumeRemove(ctx context.Context, args []string) error {
	c := r.command("volume rm", volumeUsage)
	pos, err := c.parse(args, 1, -1)
	if err != nil {
		return err
	}
	for _, ref := range pos {
		if err := r.c.DeleteVolume(ctx, ref); err != nil {
			return err
		}
		if !*c.json {
			fmt.Fprintln(r.stdout, ref)
		}
	}
	return nil
}

// volumeMounts is the repeatable --volume NAME:/PATH[:ro] flag of
// 'kiln sandbox create'.
type volumeMounts []api.VolumeMount

func (v *volumeMounts) String() string { return "" }

func (v *volumeMounts) Set(s string) error {
	name, rest, ok := strings.Cut(s, ":")
	if !ok || name == "" || rest == "" {
		return fmt.Errorf("want NAME:/PATH or NAME:/PATH:ro, got %q", s)
	}
	m := api.VolumeMount{Volume: name, Path: rest}
	if p, ok := strings.CutSuffix(rest, ":ro"); ok {
		m.Path, m.ReadOnly = p, true
	}
	*v = append(*v, m)
	return nil
}

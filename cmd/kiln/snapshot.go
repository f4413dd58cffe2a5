package main

import (
	"context"
	"fmt"
	"time"
)

const sandboxSnapshotUsage = `Usage: kiln sandbox snapshot ID NAME

Takes a named snapshot of a running runsc sandbox: its memory, processes
and files. The sandbox is frozen for a fraction of a second and keeps
running. Create sandboxes from it with 'kiln sandbox create --snapshot
NAME'; list and delete snapshots with 'kiln snapshot ls|rm'. Names are
1-64 letters, digits, '.', '_' or '-', unique among your snapshots.

Example:
  kiln sandbox snapshot i8cx2kq0v7n3ma5wd1ef before-training
  kiln sandbox create --snapshot before-training
`

const snapshotUsage = `Usage:
  kiln snapshot ls           list your snapshots: NAME SOURCE TEMPLATE SIZE AGE
  kiln snapshot get NAME     show one snapshot
  kiln snapshot rm NAME...   delete snapshots (sandboxes made from them live on)

Take snapshots with 'kiln sandbox snapshot ID NAME'; create sandboxes from
them with 'kiln sandbox create --snapshot NAME'.
` + remoteHelp

func snapshotCmd(ctx context.Context, args []string) error { return newRemote().snapshot(ctx, args) }

func (r *remote) snapshot(ctx context.Context, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"ls": r.snapshotList, "list": r.snapshotList, "get": r.snapshotGet, "rm": r.snapshotRemove, "delete": r.snapshotRemove,
	}
	return r.dispatch(ctx, "snapshot", snapshotUsage, cmds, args)
}

func (r *remote) sandboxSnapshot(ctx context.Context, args []string) error {
	c := r.command("sandbox snapshot", sandboxSnapshotUsage)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	s, err := r.c.CreateSnapshot(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(s)
	}
	fmt.Fprintf(r.stdout, "%s (%s)\n", s.Name, bytesString(s.SizeBytes))
	return nil
}

func (r *remote) snapshotList(ctx context.Context, args []string) error {
	c := r.command("snapshot ls", snapshotUsage)
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	l, err := r.c.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(l.Snapshots)
	}
	tw := r.table()
	fmt.Fprintln(tw, "NAME\tSOURCE\tTEMPLATE\tSIZE\tAGE")
	now := time.Now()
	for _, s := range l.Snapshots {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Source, s.Template, bytesString(s.SizeBytes), age(now.Sub(s.CreatedAt)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "%d snapshots, %s\n", len(l.Snapshots), bytesString(l.TotalBytes))
	return nil
}

func (r *remote) snapshotGet(ctx context.Context, args []string) error {
	c := r.command("snapshot get", snapshotUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	s, err := r.c.GetSnapshot(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(s)
	}
	fmt.Fprintf(r.stdout, "name:     %s\nid:       %s\nsource:   %s\ntemplate: %s\nruntime:  %s\nsize:     %s\ncreated:  %s\n",
		s.Name, s.ID, s.Source, s.Template, s.Runtime, bytesString(s.SizeBytes), s.CreatedAt.Local().Format(time.DateTime))
	return nil
}

func (r *remote) snapshotRemove(ctx context.Context, args []string) error {
	c := r.command("snapshot rm", snapshotUsage)
	pos, err := c.parse(args, 1, -1)
	if err != nil {
		return err
	}
	for _, name := range pos {
		if err := r.c.DeleteSnapshot(ctx, name); err != nil {
			return err
		}
		if !*c.json {
			fmt.Fprintln(r.stdout, name)
		}
	}
	return nil
}

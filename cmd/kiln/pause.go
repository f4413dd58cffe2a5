package main

import (
	"context"
	"fmt"
)

const pauseUsage = `Usage: kiln sandbox pause ID

Pauses a running sandbox. On runsc its memory, processes and files are
saved to disk and nothing of it keeps running; on runc it is frozen (its
memory stays allocated). Its timeout stops: it stays until it is resumed
or killed, also across restarts of kiln serve, or until the server's
maximum paused lifetime (KILN_MAX_PAUSED, 7 days by default) passes.

Example:
  kiln sandbox pause i8cx2kq0v7n3ma5wd1ef
`

const resumeUsage = `Usage: kiln sandbox resume ID

Resumes a paused sandbox with its processes, memory and files as they
were; its timeout starts over. A sandbox created with --auto-pause is
also resumed by any command, file or code call.

Example:
  kiln sandbox resume i8cx2kq0v7n3ma5wd1ef
`

func (r *remote) sandboxPause(ctx context.Context, args []string) error {
	c := r.command("sandbox pause", pauseUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	sb, err := r.c.Pause(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sb)
	}
	fmt.Fprintf(r.stdout, "%s paused\n", sb.ID)
	return nil
}

func (r *remote) sandboxResume(ctx context.Context, args []string) error {
	c := r.command("sandbox resume", resumeUsage)
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	sb, err := r.c.Resume(ctx, pos[0])
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sb)
	}
	fmt.Fprintf(r.stdout, "%s running\n", sb.ID)
	return nil
}

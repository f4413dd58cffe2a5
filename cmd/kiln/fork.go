package main

import (
	"context"
	"fmt"
)

const forkUsage = `Usage: kiln sandbox fork ID [--count N]

Forks a running runsc sandbox into N new sandboxes (1-16, default 1) that
continue from its current memory, processes and files and then diverge
independently. The source is frozen briefly and keeps running. Prints the
new sandboxes' ids, one a line.

Example:
  kiln sandbox fork i8cx2kq0v7n3ma5wd1ef --count 4
`

func (r *remote) sandboxFork(ctx context.Context, args []string) error {
	c := r.command("sandbox fork", forkUsage)
	count := c.fs.Int("count", 1, "how many forks to make (1-16)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	sbs, err := r.c.Fork(ctx, pos[0], *count)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(sbs)
	}
	for _, sb := range sbs {
		fmt.Fprintln(r.stdout, sb.ID)
	}
	return nil
}

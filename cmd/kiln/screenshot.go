package main

import (
	"context"
	"fmt"
	"os"
)

const screenshotUsage = `Usage: kiln sandbox screenshot ID [-o FILE] [--display :0]

Saves a PNG of the sandbox's screen (GET /v1/sandboxes/{id}/screenshot):
a sandbox of the desktop template, or any with an X server and scrot.
Without -o the PNG goes to stdout.

Examples:
  kiln sandbox screenshot i8cx2kq0v7n3ma5wd1ef -o screen.png
  kiln sandbox screenshot i8cx2kq0v7n3ma5wd1ef > screen.png
`

func (r *remote) sandboxScreenshot(ctx context.Context, args []string) error {
	c := r.command("sandbox screenshot", screenshotUsage)
	out := c.fs.String("o", "", "write the PNG to `file` (default stdout)")
	display := c.fs.String("display", "", "the X `display` (default :0)")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	png, err := r.c.Screenshot(ctx, pos[0], *display)
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = r.stdout.Write(png)
		return err
	}
	if err := os.WriteFile(*out, png, 0o644); err != nil {
		return err
	}
	if !*c.json {
		fmt.Fprintf(r.stderr, "%s: %d bytes\n", *out, len(png))
	}
	return nil
}

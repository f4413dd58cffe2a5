package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/api"
)

const keysUsage = `Usage:
  kiln keys create NAME [--admin] [--max-sandboxes N] [--max-memory 8G]
  kiln keys ls
  kiln keys revoke ID...

Manages API keys; needs an admin key in KILN_API_KEY. Run 'kiln keys
COMMAND -h' for a command's flags and examples.
` + remoteHelp

func keysCmd(ctx context.Context, args []string) error { return newRemote().keys(ctx, args) }

func (r *remote) keys(ctx context.Context, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"create": r.keysCreate, "ls": r.keysList, "list": r.keysList, "revoke": r.keysRevoke, "rm": r.keysRevoke,
	}
	return r.dispatch(ctx, "keys", keysUsage, cmds, args)
}

const keysCreateUsage = `Usage: kiln keys create NAME [--admin] [--max-sandboxes N] [--max-memory SIZE]

Creates an API key and prints its secret on stdout: this is the only time
the server shows it. Quotas left at 0 take the server's defaults.

Examples:
  kiln keys create ci --max-sandboxes 20 --max-memory 16G
  KILN_API_KEY=$(kiln keys create agent-1) kiln sandbox ls
`

func (r *remote) keysCreate(ctx context.Context, args []string) error {
	c := r.command("keys create", keysCreateUsage)
	var req api.CreateKeyRequest
	c.fs.BoolVar(&req.Admin, "admin", false, "an admin key: may manage keys")
	c.fs.IntVar(&req.MaxSandboxes, "max-sandboxes", 0, "most sandboxes alive at once")
	c.fs.Var(sizeFlag{&req.MaxMemoryBytes}, "max-memory", "most memory of all its sandboxes together, e.g. 8G")
	pos, err := c.parse(args, 1, 1)
	if err != nil {
		return err
	}
	req.Name = pos[0]
	k, err := r.c.CreateKey(ctx, req)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(k)
	}
	fmt.Fprintln(r.stdout, k.Secret)
	fmt.Fprintf(r.stderr, "kiln: created key %s (%s); the secret above is not shown again\n", k.ID, k.Name)
	return nil
}

const keysListUsage = `Usage: kiln keys ls

Lists API keys (without secrets): ID NAME PREFIX ADMIN MAX-SANDBOXES
MAX-MEMORY CREATED REVOKED.

Examples:
  kiln keys ls
  kiln keys ls --json
`

func (r *remote) keysList(ctx context.Context, args []string) error {
	c := r.command("keys ls", keysListUsage)
	if _, err := c.parse(args, 0, 0); err != nil {
		return err
	}
	ks, err := r.c.ListKeys(ctx)
	if err != nil {
		return err
	}
	if *c.json {
		if ks == nil {
			ks = []api.APIKey{}
		}
		return r.printJSON(ks)
	}
	orDefault := func(s string, zero bool) string {
		if zero {
			return "default"
		}
		return s
	}
	now := time.Now()
	tw := r.table()
	fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tADMIN\tMAX-SANDBOXES\tMAX-MEMORY\tCREATED\tREVOKED")
	for _, k := range ks {
		revoked := "-"
		if !k.RevokedAt.IsZero() {
			revoked = age(now.Sub(k.RevokedAt)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s ago\t%s\n", k.ID, k.Name, k.Prefix, k.Admin,
			orDefault(strconv.Itoa(k.MaxSandboxes), k.MaxSandboxes == 0),
			orDefault(bytesString(k.MaxMemoryBytes), k.MaxMemoryBytes == 0),
			age(now.Sub(k.CreatedAt)), revoked)
	}
	return tw.Flush()
}

const keysRevokeUsage = `Usage: kiln keys revoke ID...

Revokes API keys by ID (see 'kiln keys ls'); requests made with them fail
with 401 from then on. Prints each id revoked.

Examples:
  kiln keys revoke key_abc123
`

func (r *remote) keysRevoke(ctx context.Context, args []string) error {
	c := r.command("keys revoke", keysRevokeUsage)
	ids, err := c.parse(args, 1, -1)
	if err != nil {
		return err
	}
	revoked := []string{}
	for _, id := range ids {
		if err := r.c.RevokeKey(ctx, id); err != nil {
			return err
		}
		revoked = append(revoked, id)
		if !*c.json {
			fmt.Fprintln(r.stdout, id)
		}
	}
	if *c.json {
		return r.printJSON(map[string][]string{"revoked": revoked})
	}
	return nil
}

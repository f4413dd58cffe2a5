package template

import (
	"context"
	"errors"
	"fmt"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Who may see and change custom templates, for both of kiln serve's
// template APIs (the native /v1/templates and E2B's). A template belongs
// to the key that built it; an admin key sees and manages every key's; a
// public one is visible and usable by every key, but only its owner (or
// an admin) may change or delete it. Another key's private template is
// not found, as another key's sandbox is.

// Caller is the API key a template request comes from.
type Caller struct {
	ID    string
	Admin bool
}

// NotFound is the error for a template the caller cannot see.
func NotFound(name, tag string) error {
	return fmt.Errorf("template %s:%s not found: %w", name, tag, errdefs.ErrNotFound)
}

// FindTag returns the tag name:tag means to c: its own, else (an admin)
// any key's, else a public one. It returns ErrNotFound otherwise,
// including for built-ins.
func (cat *Catalog) FindTag(ctx context.Context, c Caller, name, tag string) (TagRecord, error) {
	t, err := cat.Store.GetTag(ctx, c.ID, name, tag)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	var tags []TagRecord
	if c.Admin {
		if tags, err = cat.Store.ListTags(ctx, "", name); err != nil {
			return t, err
		}
	}
	pub, err := cat.Store.PublicTags(ctx, name)
	if err != nil {
		return t, err
	}
	for _, o := range append(tags, pub...) {
		if o.Tag == tag {
			return o, nil
		}
	}
	return t, NotFound(name, tag)
}

// OwnerOf returns the owner of the template name that c may change: its
// own; for an admin, the one key's that has one of that name. Another
// key's public template is ErrPermissionDenied, a built-in too; anything
// else ErrNotFound.
func (cat *Catalog) OwnerOf(ctx context.Context, c Caller, name string) (string, error) {
	own, err := cat.Store.ListTags(ctx, c.ID, name)
	if err != nil {
		return "", err
	}
	if len(own) > 0 {
		return c.ID, nil
	}
	if c.Admin {
		all, err := cat.Store.ListTags(ctx, "", name)
		if err != nil {
			return "", err
		}
		owners := map[string]bool{}
		for _, t := range all {
			owners[t.Owner] = true
		}
		switch len(owners) {
		case 1:
			return all[0].Owner, nil
		case 0:
		default:
			return "", fmt.Errorf("%d keys have a template named %s: use one of their keys to change it: %w", len(owners), name, errdefs.ErrFailedPrecondition)
		}
	}
	pub, err := cat.Store.PublicTags(ctx, name)
	if err != nil {
		return "", err
	}
	if len(pub) > 0 {
		return "", fmt.Errorf("template %s belongs to another key: only its owner or an admin may change it: %w", name, errdefs.ErrPermissionDenied)
	}
	if Builtin()[name] != nil {
		return "", fmt.Errorf("template %s is built in: it cannot be changed: %w", name, errdefs.ErrPermissionDenied)
	}
	return "", fmt.Errorf("template %s not found: %w", name, errdefs.ErrNotFound)
}

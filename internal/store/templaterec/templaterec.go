// Package templaterec holds what the store backends share about template
// records (internal/template.Store): how a build's spec, config and layers
// become JSON columns and back, and the listing bounds.
package templaterec

import (
	"encoding/json"
	"fmt"

	"github.com/kiln-sh/kiln/internal/store/page"
	"github.com/kiln-sh/kiln/internal/template"
)

// Columns are a build's JSON columns.
type Columns struct {
	Spec, Config, Layers []byte
}

// Encode turns b's structured fields into JSON. Registry credentials in
// the spec are dropped: they are never stored.
func Encode(b template.BuildRecord) (Columns, error) {
	spec := b.Spec
	spec.From.Registry = nil
	var (
		c   Columns
		err error
	)
	if c.Spec, err = json.Marshal(spec); err != nil {
		return c, fmt.Errorf("encoding build %s spec: %w", b.ID, err)
	}
	if c.Config, err = json.Marshal(b.Config); err != nil {
		return c, fmt.Errorf("encoding build %s config: %w", b.ID, err)
	}
	layers := b.Layers
	if layers == nil {
		layers = []string{}
	}
	if c.Layers, err = json.Marshal(layers); err != nil {
		return c, fmt.Errorf("encoding build %s layers: %w", b.ID, err)
	}
	return c, nil
}

// Decode fills b's structured fields from c. Empty lists and maps come
// back nil.
func Decode(b *template.BuildRecord, c Columns) error {
	if err := json.Unmarshal(c.Spec, &b.Spec); err != nil {
		return fmt.Errorf("decoding build %s spec: %w", b.ID, err)
	}
	if err := json.Unmarshal(c.Config, &b.Config); err != nil {
		return fmt.Errorf("decoding build %s config: %w", b.ID, err)
	}
	if err := json.Unmarshal(c.Layers, &b.Layers); err != nil {
		return fmt.Errorf("decoding build %s layers: %w", b.ID, err)
	}
	if len(b.Layers) == 0 {
		b.Layers = nil
	}
	return nil
}

// Limit turns ListBuilds' limit into the one to use: 0 means
// page.DefaultSize, anything above page.MaxSize is capped, negatives are
// errdefs.ErrInvalidArgument.
func Limit(limit int) (int, error) {
	n, err := page.Size(limit)
	if err != nil {
		return 0, fmt.Errorf("listing template builds: %w", err)
	}
	return n, nil
}

package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// CreateLog is the file in the bundle dir receiving the create command's
// stderr (and the container's, when IO.Stderr is nil).
const CreateLog = "create.log"

// Bundle is an OCI bundle: a directory holding config.json.
type Bundle struct {
	Dir  string
	Spec *specs.Spec
}

// Write writes Dir/config.json, creating Dir if needed.
func (b *Bundle) Write() error {
	if b.Spec == nil {
		return fmt.Errorf("writing bundle: no spec")
	}
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return fmt.Errorf("creating bundle dir: %w", err)
	}
	data, err := json.MarshalIndent(b.Spec, "", "\t")
	if err != nil {
		return fmt.Errorf("encoding spec: %w", err)
	}
	tmp := filepath.Join(b.Dir, ".config.json.tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing spec: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(b.Dir, "config.json")); err != nil {
		return fmt.Errorf("writing spec: %w", err)
	}
	return nil
}

// ReadBundle loads the bundle in dir.
func ReadBundle(dir string) (*Bundle, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("reading spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decoding spec: %w", err)
	}
	return &Bundle{Dir: dir, Spec: &s}, nil
}

package e2b

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
)

// secretBytes is the size of the envd token secret.
const secretBytes = 32

// LoadSecret returns the secret kept in file, creating it (random, mode
// 0600) on first use. It must stay the same across restarts: the
// sandboxes' envd access tokens are derived from it.
func LoadSecret(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil {
		if len(b) < secretBytes {
			return nil, fmt.Errorf("E2B secret %s: %d bytes, want %d (remove it to make a new one)", file, len(b), secretBytes)
		}
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading E2B secret: %w", err)
	}
	b = make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("making E2B secret: %w", err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) { // another process made it first
		return LoadSecret(file)
	}
	if err != nil {
		return nil, fmt.Errorf("creating E2B secret: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(file)
		return nil, fmt.Errorf("writing E2B secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing E2B secret: %w", err)
	}
	return b, f.Close()
}

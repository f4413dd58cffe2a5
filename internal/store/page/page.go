// Package page holds what the store backends share about listing records
// one page at a time: the page size rules and the opaque keyset token.
//
// Pages are keyset-paginated on (created_at, id): a token names the last
// record of the previous page, so inserts and deletes between calls never
// shift or repeat records the way an offset would.
package page

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

const (
	// DefaultSize is the page size when the caller asks for none.
	DefaultSize = 100
	// MaxSize is the largest page a caller gets.
	MaxSize = 1000
)

// Size turns a requested page size into the one to use: 0 means
// DefaultSize, anything above MaxSize is capped, negatives are refused.
func Size(limit int) (int, error) {
	switch {
	case limit < 0:
		return 0, fmt.Errorf("page size %d: %w", limit, errdefs.ErrInvalidArgument)
	case limit == 0:
		return DefaultSize, nil
	case limit > MaxSize:
		return MaxSize, nil
	}
	return limit, nil
}

// Key is the position of one record in the listing order.
type Key struct {
	CreatedAt time.Time
	ID        string
}

// Encode returns the opaque token for the page after k.
func Encode(k Key) string {
	b := binary.BigEndian.AppendUint64(nil, uint64(k.CreatedAt.UnixMicro()))
	b = append(b, k.ID...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode parses a token made by Encode; ok is false for "" (the first
// page). A token that Encode could not have made is ErrInvalidArgument.
func Decode(token string) (k Key, ok bool, err error) {
	if token == "" {
		return Key{}, false, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) <= 8 {
		return Key{}, false, fmt.Errorf("decoding page token: %w", errdefs.ErrInvalidArgument)
	}
	micros := int64(binary.BigEndian.Uint64(b[:8]))
	return Key{CreatedAt: time.UnixMicro(micros).UTC(), ID: string(b[8:])}, true, nil
}

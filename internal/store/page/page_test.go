package page

import (
	"errors"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestTokenRoundTrip(t *testing.T) {
	for _, k := range []Key{
		{time.Date(2025, 3, 14, 15, 9, 26, 535897000, time.UTC), "abc123"},
		{time.Time{}, "x"},
		{time.Date(1960, 1, 1, 0, 0, 0, 1000, time.UTC), "before-epoch/ünï"},
	} {
		got, ok, err := Decode(Encode(k))
		if err != nil || !ok || !got.CreatedAt.Equal(k.CreatedAt) || got.ID != k.ID {
			t.Errorf("Decode(Encode(%v)) = %v, %v, %v", k, got, ok, err)
		}
	}
	if _, ok, err := Decode(""); ok || err != nil {
		t.Errorf(`Decode("") = %v, %v; want first page`, ok, err)
	}
	for _, tok := range []string{"%%%", "AAAA", "AAAAAAAAAAA", "QUFBQUFBQUFB=="} {
		if _, _, err := Decode(tok); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Decode(%q) = %v, want ErrInvalidArgument", tok, err)
		}
	}
}

func TestSize(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{0, 100}, {1, 1}, {1000, 1000}, {1001, 1000}} {
		if got, err := Size(tc.in); got != tc.want || err != nil {
			t.Errorf("Size(%d) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	if _, err := Size(-1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Size(-1) = %v, want ErrInvalidArgument", err)
	}
}

package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

// TestCodes: every API code but internal has one class and back; wrapped
// errors keep their class; unclassified errors are internal.
func TestCodes(t *testing.T) {
	for _, code := range api.ErrorCodes() {
		class := Class(code)
		if code == api.CodeInternal {
			if class != nil {
				t.Errorf("Class(internal) = %v, want nil", class)
			}
			continue
		}
		if class == nil {
			t.Errorf("Class(%s) = nil", code)
			continue
		}
		err := fmt.Errorf("doing something: %w", class)
		if got := Code(err); got != code {
			t.Errorf("Code(%v) = %s, want %s", err, got, code)
		}
		if got := ClassOf(err); got != class {
			t.Errorf("ClassOf(%v) = %v, want %v", err, got, class)
		}
	}
	for _, tc := range []struct {
		err  error
		want api.ErrorCode
	}{
		{errors.New("disk on fire"), api.CodeInternal},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), api.CodeDeadlineExceeded},
		{fmt.Errorf("bad name: %w", fmt.Errorf("no template: %w", ErrNotFound)), api.CodeNotFound},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if ClassOf(errors.New("x")) != nil {
		t.Error("ClassOf of an unclassified error is not nil")
	}
}

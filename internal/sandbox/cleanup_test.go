package sandbox

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestCleanup(t *testing.T) {
	errB := errors.New("b failed")
	errD := errors.New("d failed")
	tests := []struct {
		name     string
		steps    []string // a step named x fails when fail[x] is set
		fail     map[string]error
		release  bool
		wantRun  []string
		wantErrs []error
	}{
		{name: "unwinds in reverse", steps: []string{"a", "b", "c"}, wantRun: []string{"c", "b", "a"}},
		{name: "partial failure runs every step and joins errors", steps: []string{"a", "b", "c", "d"},
			fail: map[string]error{"b": errB, "d": errD}, wantRun: []string{"d", "c", "b", "a"}, wantErrs: []error{errB, errD}},
		{name: "release keeps everything", steps: []string{"a", "b"}, release: true, wantRun: nil},
		{name: "empty", wantRun: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c cleanup
			var ran []string
			for _, s := range tt.steps {
				c.add(func(context.Context) error {
					ran = append(ran, s)
					return tt.fail[s]
				})
			}
			if tt.release {
				c.release()
			}
			err := c.unwind(context.Background())
			if !slices.Equal(ran, tt.wantRun) {
				t.Errorf("ran %v, want %v", ran, tt.wantRun)
			}
			for _, want := range tt.wantErrs {
				if !errors.Is(err, want) {
					t.Errorf("unwind error %v does not carry %v", err, want)
				}
			}
			if len(tt.wantErrs) == 0 && err != nil {
				t.Errorf("unwind: %v", err)
			}
			ran = nil
			if err := c.unwind(context.Background()); err != nil || len(ran) != 0 {
				t.Errorf("second unwind ran %v (err %v); the stack should be empty", ran, err)
			}
		})
	}
}

// The steps run on a context that outlives the caller's: a create whose
// client went away still unwinds.
func TestCleanupDetachedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var c cleanup
	var sawErr error
	c.add(func(ctx context.Context) error { sawErr = ctx.Err(); return nil })
	if err := c.unwind(ctx); err != nil {
		t.Fatal(err)
	}
	if sawErr != nil {
		t.Errorf("undo step saw a done context: %v", sawErr)
	}
}

func TestCleanupTake(t *testing.T) {
	var outer, inner cleanup
	var ran []string
	step := func(s string) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, s); return nil }
	}
	outer.add(step("outer"))
	inner.add(step("inner1"))
	inner.add(step("inner2"))
	outer.take(&inner)
	if err := inner.unwind(context.Background()); err != nil || len(ran) != 0 {
		t.Fatalf("inner still ran %v after take", ran)
	}
	if err := outer.unwind(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"inner2", "inner1", "outer"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
}

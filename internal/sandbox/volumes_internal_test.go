package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

func TestValidateVolumeMounts(t *testing.T) {
	many := make([]VolumeMount, MaxVolumeMounts+1)
	for i := range many {
		many[i] = VolumeMount{Volume: "v", Path: "/m" + strings.Repeat("x", i)}
	}
	tests := []struct {
		name string
		in   []VolumeMount
		ok   bool
	}{
		{"none", nil, true},
		{"two, one volume twice", []VolumeMount{{Volume: "v", Path: "/data"}, {Volume: "v", Path: "/home/user/ro", ReadOnly: true}}, true},
		{"near a reserved path", []VolumeMount{{Volume: "v", Path: "/procfs"}, {Volume: "v", Path: "/devel"}}, true},
		{"relative", []VolumeMount{{Volume: "v", Path: "data"}}, false},
		{"unclean", []VolumeMount{{Volume: "v", Path: "/data/../etc"}}, false},
		{"trailing slash", []VolumeMount{{Volume: "v", Path: "/data/"}}, false},
		{"root", []VolumeMount{{Volume: "v", Path: "/"}}, false},
		{"proc", []VolumeMount{{Volume: "v", Path: "/proc"}}, false},
		{"under sys", []VolumeMount{{Volume: "v", Path: "/sys/fs"}}, false},
		{"under dev", []VolumeMount{{Volume: "v", Path: "/dev/shm"}}, false},
		{"the agent's", []VolumeMount{{Volume: "v", Path: "/.kiln/x"}}, false},
		{"no volume", []VolumeMount{{Path: "/data"}}, false},
		{"same path twice", []VolumeMount{{Volume: "a", Path: "/data"}, {Volume: "b", Path: "/data"}}, false},
		{"NUL", []VolumeMount{{Volume: "v", Path: "/da\x00ta"}}, false},
		{"too many", many, false},
	}
	for _, tt := range tests {
		err := validateVolumeMounts(tt.in)
		if tt.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

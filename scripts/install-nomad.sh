#!/usr/bin/env bash
# Builds a pinned HashiCorp Nomad from the Go module proxy and installs it to
# /usr/local/lib/kiln/nomad, for test/nomad (Kiln deployed by the job files in
# deploy/nomad onto a real Nomad cluster on loopback). Idempotent: does
# nothing when the installed binary already reports the pinned version, so a
# cached run costs one `nomad version` (~50 ms).
#
# Nomad's module zip leaves out its nested api module, which its go.mod
# replaces with ./api: copy the module into a writable dir, put the pinned
# api module there as ./api, and build (docs: shared platform notes,
# "Distributed engines on these machines"). The first build takes ~3.5 min on
# 2 idle cores, much longer on a loaded machine; the binary is ~130 MiB.
#
# Concurrent callers (two test binaries, or make and a test) are serialised
# by a lock; the loser finds the binary installed and returns at once.
# The build runs niced: on CI it overlaps other test packages, some of them
# timing-sensitive (test/cluster's heartbeats), which should keep the CPU.
#
# Env overrides: NOMAD_DEST (install path), NOMAD_VERSION, NOMAD_API_VERSION.
set -euo pipefail

VERSION="${NOMAD_VERSION:-v1.10.5}"
# The api module's pseudo-version that Nomad v1.10.5's go.mod requires.
API_VERSION="${NOMAD_API_VERSION:-v0.0.0-20250909143645-a3b86c697f38}"
DEST="${NOMAD_DEST:-/usr/local/lib/kiln/nomad}"

installed() {
	[ -x "$DEST" ] && [ "$("$DEST" version 2>/dev/null | head -n1 | cut -d' ' -f2)" = "$VERSION" ]
}

installed && exit 0

. "$(dirname "$0")/gotool.sh"
find_go install-nomad

lock_install "$DEST"
installed && exit 0

echo "install-nomad: building github.com/hashicorp/nomad@${VERSION} (takes a few minutes)" >&2
start=$(date +%s)
tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

# Outside any module, so a caller's go.mod does not interfere.
dirs="$(cd "$tmp" && "$GO" mod download -json \
	"github.com/hashicorp/nomad@${VERSION}" "github.com/hashicorp/nomad/api@${API_VERSION}" |
	sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
nomad_dir="$(echo "$dirs" | sed -n 1p)"
api_dir="$(echo "$dirs" | sed -n 2p)"
if [ -z "$nomad_dir" ] || [ -z "$api_dir" ]; then
	echo "install-nomad: go mod download gave no module dirs" >&2
	exit 1
fi
cp -r "$nomad_dir" "$tmp/nomad"
cp -r "$api_dir" "$tmp/nomad/api"
chmod -R u+w "$tmp/nomad"
(
	cd "$tmp/nomad"
	# -mod=mod: the module proxy's copy has no vendor dir; go.sum is Nomad's.
	GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/nomad.bin" .
)

got="$("$tmp/nomad.bin" version | head -n1 | cut -d' ' -f2)"
if [ "$got" != "$VERSION" ]; then
	echo "install-nomad: built nomad reports version '$got', want '$VERSION'" >&2
	exit 1
fi
install -m 0755 "$tmp/nomad.bin" "$DEST.new"
mv -f "$DEST.new" "$DEST"
echo "install-nomad: installed $DEST ($VERSION) in $(($(date +%s) - start)) s" >&2

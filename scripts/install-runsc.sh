#!/usr/bin/env bash
# Builds a pinned, recent gVisor runsc from the Go module proxy and installs it
# to /usr/local/lib/kiln/runsc. Idempotent: does nothing when the installed
# binary already reports the pinned version.
#
# Why not Debian's runsc (0.0~20221219): ptrace platform only (slow), and its
# statx rejects AT_NO_AUTOMOUNT, so bookworm's `ls -l` / `stat` fail inside
# sandboxes. See docs/gvisor-notes.md.
#
# The build MUST be static (CGO_ENABLED=0). A cgo build is dynamically linked:
# the gofer and sentry pivot_root into a near-empty tmpfs and then re-exec
# /proc/self/exe, whose ELF interpreter (/lib64/ld-linux-x86-64.so.2) is not
# there, so `runsc run`/`create` fail with
#   "error executing umounter: fork/exec /proc/self/exe: no such file or directory".
#
# Env overrides: RUNSC_DEST (install path), RUNSC_GVISOR_VERSION (module version).
set -euo pipefail

GVISOR_VERSION="${RUNSC_GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
DEST="${RUNSC_DEST:-/usr/local/lib/kiln/runsc}"
# Version string stamped into the binary (`runsc --version`), derived from the
# pseudo-version: v0.0.0-<timestamp>-<commit> -> go-<timestamp>-<commit>.
STAMP="go-${GVISOR_VERSION#v0.0.0-}"

installed_version() {
	[ -x "$DEST" ] || return 0
	"$DEST" --version 2>/dev/null | sed -n 's/^runsc version //p' | head -n1
}

if [ "$(installed_version)" = "$STAMP" ]; then
	exit 0
fi

. "$(dirname "$0")/gotool.sh"
find_go install-runsc

echo "install-runsc: building gvisor.dev/gvisor/runsc@${GVISOR_VERSION} (takes a few minutes)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Build outside any module so the repo's go.mod does not interfere.
(
	cd "$tmp"
	CGO_ENABLED=0 GOBIN="$tmp/bin" GOFLAGS=-mod=mod "$GO" install \
		-trimpath \
		-ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=${STAMP}" \
		"gvisor.dev/gvisor/runsc@${GVISOR_VERSION}"
)

bin="$tmp/bin/runsc"
# Refuse a dynamically linked binary: it cannot re-exec after pivot_root.
if command -v readelf >/dev/null && readelf -l "$bin" | grep -q 'program interpreter'; then
	echo "install-runsc: built runsc is dynamically linked; refusing to install" >&2
	exit 1
fi
got="$("$bin" --version | sed -n 's/^runsc version //p' | head -n1)"
if [ "$got" != "$STAMP" ]; then
	echo "install-runsc: built runsc reports version '$got', want '$STAMP'" >&2
	exit 1
fi

mkdir -p "$(dirname "$DEST")"
install -m 0755 "$bin" "$DEST.new"
mv -f "$DEST.new" "$DEST"
echo "install-runsc: installed $DEST ($STAMP)"

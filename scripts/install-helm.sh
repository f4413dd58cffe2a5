#!/usr/bin/env bash
# Builds a pinned Helm from the Go module proxy and installs it to
# /usr/local/lib/kiln/helm, for the chart test in deploy/helm (helm lint and
# helm template of deploy/helm/kiln). Idempotent: a cached run costs one
# `helm version` (~50 ms); the first build takes ~1 min on 2 idle cores.
#
# Env overrides: HELM_DEST (install path), HELM_VERSION.
set -euo pipefail

VERSION="${HELM_VERSION:-v3.22.0}"
DEST="${HELM_DEST:-/usr/local/lib/kiln/helm}"

installed() {
	[ -x "$DEST" ] && "$DEST" version --short 2>/dev/null | grep -q "^${VERSION}+\?"
}

installed && exit 0

. "$(dirname "$0")/gotool.sh"
find_go install-helm

lock_install "$DEST"
installed && exit 0

echo "install-helm: building helm.sh/helm/v3/cmd/helm@${VERSION}" >&2
start=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Outside any module, so a caller's go.mod does not interfere. The version
# is stamped as Helm's own Makefile does, so `helm version` can be checked.
(
	cd "$tmp"
	CGO_ENABLED=0 GOBIN="$tmp/bin" GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" install -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${VERSION}" \
		"helm.sh/helm/v3/cmd/helm@${VERSION}"
)
got="$("$tmp/bin/helm" version --short)"
case "$got" in
"$VERSION"*) ;;
*)
	echo "install-helm: built helm reports '$got', want $VERSION" >&2
	exit 1
	;;
esac
install -m 0755 "$tmp/bin/helm" "$DEST.new"
mv -f "$DEST.new" "$DEST"
echo "install-helm: installed $DEST ($VERSION) in $(($(date +%s) - start)) s" >&2

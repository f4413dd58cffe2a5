#!/usr/bin/env bash
# Builds a pinned Kubernetes API server and etcd from the Go module proxy and
# installs them to /usr/local/lib/kiln/{kube-apiserver,etcd}, for test/helm
# (the chart installed into a real control plane on loopback: server-side
# dry-run of every rendered object, helm install and uninstall). No kubelet,
# scheduler or kubectl: the test talks to the API server with client-go.
# Idempotent: does nothing when both binaries already report the pinned
# versions, so a cached run costs two `--version` calls (~100 ms).
#
# k8s.io/kubernetes replaces its k8s.io/* staging modules with ./staging
# dirs, which a dependent module cannot see: a wrapper module requires
# k8s.io/kubernetes and replaces each staging module with its published
# v0.<minor>.<patch> (the list is read from Kubernetes' own go.mod). etcd's
# server module replaces its sibling modules with ../ paths, so it too is
# built from a wrapper module (replaces of a dependency are ignored). Docs:
# shared platform notes, "Distributed engines on these machines".
#
# The first build takes minutes: measured on 2 cores at load 20-50, etcd
# 48 s and the API server 19 min of wall time for 6 min of CPU, module
# downloads included (the platform notes: 6.5 min on an idle machine). It
# runs niced, as `make test` starts it beside the other test packages.
# Concurrent callers are serialised by a lock; the loser finds the binaries
# installed and returns at once.
#
# Env overrides: KUBE_DIR (install dir), KUBE_VERSION, ETCD_VERSION.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
DIR="${KUBE_DIR:-/usr/local/lib/kiln}"

apiserver_installed() {
	[ -x "$DIR/kube-apiserver" ] &&
		[ "$("$DIR/kube-apiserver" --version 2>/dev/null)" = "Kubernetes $KUBE_VERSION" ]
}
etcd_installed() {
	[ -x "$DIR/etcd" ] &&
		[ "$("$DIR/etcd" --version 2>/dev/null | sed -n 's/^etcd Version: //p')" = "${ETCD_VERSION#v}" ]
}

apiserver_installed && etcd_installed && exit 0

. "$(dirname "$0")/gotool.sh"
find_go install-kube

lock_install "$DIR/kube"
apiserver_installed && etcd_installed && exit 0

start=$(date +%s)
tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
# Static binaries, built outside the caller's module, niced.
build() { # DIR OUT PKG [LDFLAGS]
	(cd "$1" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath \
		-ldflags "-s -w ${4:-}" -o "$2" "$3")
}
# Installs a built binary in place, atomically.
put() { # BIN NAME
	install -m 0755 "$1" "$DIR/$2.new"
	mv -f "$DIR/$2.new" "$DIR/$2"
}

if ! etcd_installed; then
	echo "install-kube: building go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
	t=$(date +%s)
	mkdir "$tmp/etcd"
	printf 'module kiln.local/etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$tmp/etcd/go.mod"
	build "$tmp/etcd" "$tmp/etcd.bin" go.etcd.io/etcd/server/v3
	got="$("$tmp/etcd.bin" --version | sed -n 's/^etcd Version: //p')"
	if [ "$got" != "${ETCD_VERSION#v}" ]; then
		echo "install-kube: built etcd reports version '$got', want '${ETCD_VERSION#v}'" >&2
		exit 1
	fi
	put "$tmp/etcd.bin" etcd
	echo "install-kube: installed $DIR/etcd ($ETCD_VERSION) in $(($(date +%s) - t)) s" >&2
fi

if ! apiserver_installed; then
	echo "install-kube: building k8s.io/kubernetes/cmd/kube-apiserver@${KUBE_VERSION} (takes several minutes)" >&2
	t=$(date +%s)
	mkdir "$tmp/kube"
	kmod="$(cd "$tmp/kube" && "$GO" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" |
		sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
	if [ -z "$kmod" ]; then
		echo "install-kube: go mod download gave no go.mod for k8s.io/kubernetes@${KUBE_VERSION}" >&2
		exit 1
	fi
	staging="v0.${KUBE_VERSION#v1.}"
	{
		printf 'module kiln.local/kubebuild\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
		sed -n 's#^\t\(k8s.io/[^ ]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$kmod"
		printf ')\n'
	} >"$tmp/kube/go.mod"
	# The version the API server reports (/version, `--version`), stamped
	# as Kubernetes' hack/lib/version.sh does; Helm reads it for a chart's
	# kubeVersion.
	minor="${KUBE_VERSION#v1.}"
	minor="${minor%%.*}"
	ld=""
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
		ld="$ld -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	build "$tmp/kube" "$tmp/kube-apiserver.bin" k8s.io/kubernetes/cmd/kube-apiserver "$ld"
	got="$("$tmp/kube-apiserver.bin" --version)"
	if [ "$got" != "Kubernetes $KUBE_VERSION" ]; then
		echo "install-kube: built kube-apiserver reports '$got', want 'Kubernetes $KUBE_VERSION'" >&2
		exit 1
	fi
	put "$tmp/kube-apiserver.bin" kube-apiserver
	echo "install-kube: installed $DIR/kube-apiserver ($KUBE_VERSION) in $(($(date +%s) - t)) s" >&2
fi
echo "install-kube: done in $(($(date +%s) - start)) s" >&2

#!/usr/bin/env bash
# Installs the system packages Kiln needs, once. Idempotent: it calls apt
# only when something is missing.
set -euo pipefail

pkgs=(runsc runc debootstrap bubblewrap e2fsprogs util-linux procps postgresql nftables iproute2
	python3-ipykernel python3-matplotlib python3-pandas python3-numpy r-base-core r-cran-irkernel
	chromium) # chromium: the web console's browser tests (internal/console), headless
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Go: the machines ship it in /usr/local/go; otherwise take Debian's and let
# GOTOOLCHAIN=auto fetch the version go.mod asks for from the module proxy.
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
	echo "setup: installing go"
	apt-get install -y -qq golang-go >/dev/null
fi

# Node.js >= 20.18.1 and npm for the E2B SDK tests (test/e2b): the stock SDKs'
# engines field. Debian 12's nodejs is 18, so when the node on PATH is missing
# or older, take Debian's nodejs + npm (npm runs on any node) and put node 20
# from the npm registry's node-linux-<arch> package first on PATH.
node_ok() {
	command -v node >/dev/null && command -v npm >/dev/null &&
		node -e 'const [a,b,c]=process.versions.node.split(".").map(Number);process.exit(a>20||a==20&&(b>18||b==18&&c>=1)?0:1)'
}
if ! node_ok; then
	echo "setup: installing node 20 and npm"
	if ! command -v npm >/dev/null; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
	fi
	arch=$(dpkg --print-architecture)
	case "$arch" in amd64) arch=x64 ;; esac
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack --silent "node-linux-$arch@20.20.2" >/dev/null && tar xzf node-linux-*.tgz package/bin/node)
	install -D -m 0755 "$tmp/package/bin/node" /usr/local/lib/kiln/node/bin/node
	ln -sf /usr/local/lib/kiln/node/bin/node /usr/local/bin/node
	rm -rf "$tmp"
	hash -r
	node_ok || echo "setup: warning: node $(node --version) is still older than 20.18.1" >&2
fi

# The sandbox memory limits need cgroup v1 memory+pids controllers (or v2).
for c in memory pids cpu; do
	[ -d "/sys/fs/cgroup/$c" ] || [ -f /sys/fs/cgroup/cgroup.controllers ] ||
		echo "setup: warning: cgroup controller $c not found" >&2
done
exit 0

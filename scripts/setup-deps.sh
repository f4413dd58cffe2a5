#!/usr/bin/env bash
# Installs the system packages Kiln needs, once. Idempotent: it calls apt
# only when something is missing.
set -euo pipefail

pkgs=(runsc runc debootstrap bubblewrap e2fsprogs util-linux procps postgresql
	python3-ipykernel python3-matplotlib python3-pandas python3-numpy r-base-core r-cran-irkernel)
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

# The sandbox memory limits need cgroup v1 memory+pids controllers (or v2).
for c in memory pids cpu; do
	[ -d "/sys/fs/cgroup/$c" ] || [ -f /sys/fs/cgroup/cgroup.controllers ] ||
		echo "setup: warning: cgroup controller $c not found" >&2
done
exit 0

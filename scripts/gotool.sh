# Sourced by the scripts that build a pinned Go program from the module
# proxy and cache it in /usr/local/lib/kiln (install-runsc.sh,
# install-nomad.sh, install-helm.sh).

# find_go NAME sets GO to the go command (PATH's, or the machines'
# /usr/local/go), or exits saying NAME cannot build without it.
find_go() {
	GO=go
	if ! command -v go >/dev/null; then
		if [ -x /usr/local/go/bin/go ]; then
			GO=/usr/local/go/bin/go
		else
			echo "$1: go not found (run scripts/setup-deps.sh first)" >&2
			exit 1
		fi
	fi
}

# lock_install DEST takes DEST's install lock for the rest of the script:
# concurrent callers (two test binaries, or make and a test) build once,
# and the others find it installed once they get the lock.
lock_install() {
	mkdir -p "$(dirname "$1")"
	exec 9>"$1.lock"
	flock 9
}

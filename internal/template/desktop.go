package template

import (
	"encoding/base64"
	"fmt"
	"path"
	"strings"

	"github.com/kiln-sh/kiln/api"
)

// desktopPackages make the desktop template: what E2B's desktop SDK
// (npm @e2b/desktop, Python e2b_desktop) runs through the commands API,
// and the applications a computer-use agent drives. Debian installs no
// recommends, so every program is named.
var desktopPackages = []string{
	// The X server the SDK starts (Xvfb), xdpyinfo (its readiness check),
	// xrandr (getScreenSize), xauth.
	"xvfb", "xauth", "x11-utils", "x11-xserver-utils",
	// XFCE as startxfce4 starts it: the session, window manager, desktop
	// and panel (the SDK waits for xfce4-session, xfwm4 and xfdesktop),
	// settings daemon, a session bus for it (dbus-launch).
	"xfce4-session", "xfwm4", "xfdesktop4", "xfce4-panel", "xfce4-settings", "xfconf", "dbus-x11",
	// Input, screenshots, windows: xdotool, scrot; open() is xdg-open,
	// launch() gtk-launch.
	"xdotool", "scrot", "xdg-utils", "libgtk-3-bin",
	// The stream: x11vnc, noVNC and websockify (the SDK runs
	// /opt/noVNC/utils/novnc_proxy), netstat (its wait for the port).
	"x11vnc", "novnc", "python3-websockify", "net-tools",
	// Applications: a browser, a terminal, a text editor, a file manager,
	// Tk for small GUI programs; fonts.
	"firefox-esr", "xfce4-terminal", "mousepad", "thunar", "python3-tk",
	"fonts-dejavu-core", "fonts-liberation2",
}

// firefoxPolicies keep Firefox to the page it is asked to open: no first
// run or what's-new tabs, no default-browser question, no telemetry,
// studies or update checks (requests out of the sandbox nobody asked for).
const firefoxPolicies = `{"policies": {
  "DisableAppUpdate": true, "DisableTelemetry": true, "DisableFirefoxStudies": true,
  "DontCheckDefaultBrowser": true, "OverrideFirstRunPage": "", "OverridePostUpdatePage": "",
  "NoDefaultBookmarks": true,
  "UserMessaging": {"WhatsNew": false, "ExtensionRecommendations": false, "FeatureRecommendations": false,
    "SkipOnboarding": true, "MoreFromMozilla": false},
  "Preferences": {"datareporting.policy.dataSubmissionPolicyBypassNotification": {"Value": true, "Status": "locked"}}
}}
`

// desktopSetup puts what the desktop SDK expects where it looks: noVNC at
// /opt/noVNC (Debian's is /usr/share/novnc), its page also at /.
const desktopSetup = "ln -s /usr/share/novnc /opt/noVNC && ln -s vnc.html /usr/share/novnc/index.html"

// The desktop's warm snapshot has the desktop up: the warm step starts
// the X server with the command line the SDK's create uses by default,
// then XFCE. The SDK's create then runs the same two commands again; the
// template's wrappers, first on PATH, make them find what is running
// instead of starting a second X server (which would fail) and a second
// session (which would put a second panel and desktop on the screen). A
// create that asks for another screen (resolution, dpi) replaces the warm
// one, so it gets what it asked for, as on a cold start; the SDK runs Xvfb
// in the background, so its checks after (xdpyinfo, startxfce4) wait for
// that replacement first.
const (
	// desktopStart is the warm step's start command.
	desktopStart = `#!/bin/sh
# Kiln's desktop template: its warm step. The desktop as E2B's desktop SDK
# starts it with its defaults (display :0, 1024x768, 96 dpi).
export DISPLAY=:0
Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix &
until xdpyinfo >/dev/null 2>&1; do sleep 0.1; done
exec startxfce4
`
	// desktopReady succeeds once the desktop is up and drawn: the SDK's
	// own check (the session, window manager and desktop processes), the
	// panel and desktop windows mapped, and a second for them to paint.
	desktopReady = `#!/bin/sh
export DISPLAY=:0
pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null &&
	xdotool search --onlyvisible --class xfce4-panel >/dev/null &&
	xdotool search --onlyvisible --class xfdesktop >/dev/null && sleep 1
`
	// desktopLib is what the wrappers share.
	desktopLib = `# Kiln's desktop template: sourced by its Xvfb, xdpyinfo and startxfce4.
uid=$(id -u)
# tries N CMD...: CMD, every 0.1 s until it succeeds, at most N times.
tries() {
	n=$1; shift
	until "$@"; do
		n=$((n - 1)); [ "$n" -gt 0 ] || return 1
		sleep 0.1
	done
}
# gone PID...: each has exited (a zombie has).
gone() {
	for p; do
		case $(ps -o stat= -p "$p") in "" | Z*) ;; *) return 1 ;; esac
	done
}
# on DISPLAY NAME: this user's live processes NAME whose DISPLAY is DISPLAY.
on() {
	for p in $(pgrep -u "$uid" -x "$2"); do
		if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "DISPLAY=$1" && ! gone "$p"; then echo "$p"; fi
	done
}
# settled: no Xvfb command of this user is still deciding (its shell has
# not yet exec'd the X server, the wrapper is replacing one).
settled() { ! pgrep -u "$uid" -f '^(/usr)?/bin/(ba|da)?sh( -[a-z]+)* (/usr/local/bin/)?Xvfb [^;&|]*$' >/dev/null; }
`
	// desktopXvfb is /usr/local/bin/Xvfb.
	desktopXvfb = `#!/bin/sh
# Kiln's desktop template: an X server with exactly these arguments that
# is running already (the warm snapshot's) is taken as started; another on
# the same display is replaced, and its session ended, before this execs
# the new server.
. /usr/local/lib/kiln-desktop/lib.sh
want="$*" olds=
for pid in $(pgrep -u "$uid" -x Xvfb); do
	have=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -d' ' -f2-)
	case "$have" in
	"$want ") exit 0 ;;
	"$1 "*) olds=$pid ;;
	esac
done
if [ -n "$olds" ]; then
	for name in xfce4-session xfwm4 xfdesktop xfce4-panel; do olds="$olds $(on "$1" "$name")"; done
	kill $olds 2>/dev/null
	kill -9 $(on "$1" dbus-launch) 2>/dev/null # the session's bus: it ignores SIGTERM
	tries 50 gone $olds || kill -9 $olds 2>/dev/null
	tries 20 gone $olds
fi
exec /usr/bin/Xvfb "$@"
`
	// desktopXdpyinfo is /usr/local/bin/xdpyinfo: the SDK's check that its
	// Xvfb is up, which the SDK runs while that Xvfb command runs in the
	// background, waits for that command to settle, so that it cannot
	// see the warm X server that command is replacing (nor can what the
	// SDK runs next: startxfce4, its wait for the session's processes).
	desktopXdpyinfo = `#!/bin/sh
. /usr/local/lib/kiln-desktop/lib.sh
tries 150 settled
exec /usr/bin/xdpyinfo "$@"
`
	// desktopStartxfce4 is /usr/local/bin/startxfce4.
	desktopStartxfce4 = `#!/bin/sh
# Kiln's desktop template: a session of this user on this display is
# running already (the warm snapshot's): nothing to start.
. /usr/local/lib/kiln-desktop/lib.sh
tries 150 settled
[ -n "$(on "$DISPLAY" xfce4-session)" ] && exit 0
exec /usr/bin/startxfce4 "$@"
`
)

// installFiles is a shell command that writes each file (path, mode,
// content), making its directory.
func installFiles(files ...[3]string) string {
	var cmds []string
	for _, f := range files {
		cmds = append(cmds, fmt.Sprintf("mkdir -p %s && echo %s | base64 -d >%s && chmod %s %s", path.Dir(f[0]),
			base64.StdEncoding.EncodeToString([]byte(f[2])), f[0], f[1], f[0]))
	}
	return strings.Join(cmds, " && ")
}

// Desktop is the recipe of the desktop template, for computer use: the
// base template plus an X server, XFCE, a browser, a terminal and an
// editor, the tools E2B's desktop SDK drives them with, and the VNC
// stream (docs/desktop.md). It is large and slow to build, so it is
// built on demand (kiln template build desktop), not by make setup.
func Desktop() *Recipe {
	r := &Recipe{Name: "desktop", OnDemand: true}
	r.Spec.From.Debian = &api.DebianBase{Template: "base", Packages: desktopPackages}
	r.Spec.Steps = append([]api.TemplateStep{
		// DISPLAY is the SDK's default display, so commands of the native
		// API reach the desktop too. NO_AT_BRIDGE: no accessibility bus.
		env("LANG", "C.UTF-8", "DISPLAY", ":0", "NO_AT_BRIDGE", "1"),
		run(desktopSetup),
		run(installFiles(
			[3]string{"/etc/firefox/policies/policies.json", "0644", firefoxPolicies},
			[3]string{"/usr/local/lib/kiln-desktop/start", "0755", desktopStart},
			[3]string{"/usr/local/lib/kiln-desktop/ready", "0755", desktopReady},
			[3]string{"/usr/local/lib/kiln-desktop/lib.sh", "0644", desktopLib},
			[3]string{"/usr/local/bin/Xvfb", "0755", desktopXvfb},
			[3]string{"/usr/local/bin/xdpyinfo", "0755", desktopXdpyinfo},
			[3]string{"/usr/local/bin/startxfce4", "0755", desktopStartxfce4})),
	}, asUser...)
	r.Spec.CPUs, r.Spec.MemoryMB, r.Spec.DiskMB = 2, 2048, 4096
	r.Warm = &Warm{Start: "/usr/local/lib/kiln-desktop/start", Ready: "/usr/local/lib/kiln-desktop/ready"}
	return r
}

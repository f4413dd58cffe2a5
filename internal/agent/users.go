package agent

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/files"
	"github.com/kiln-sh/kiln/internal/agent/process"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// account is a user a caller may name.
type account struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
	shell    string
}

// Where accounts are looked up; variables so tests can point elsewhere.
var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// lookupAccount resolves a wire user name ("" means the default user)
// from /etc/passwd, falling back to uid/gid 1000 with home /home/user for
// "user" and 0/0 with /root for "root" when the template has no entry.
func lookupAccount(name string) (account, error) {
	var a account
	switch name {
	case "", wire.UserDefault:
		a = account{name: wire.UserDefault, uid: 1000, gid: 1000, home: "/home/user", shell: "/bin/bash"}
	case wire.UserRoot:
		a = account{name: wire.UserRoot, home: "/root", shell: "/bin/bash"}
	default:
		return account{}, &api.Error{Code: api.CodeInvalidArgument,
			Message: "unknown user " + strconv.Quote(name) + `: want "user" or "root"`}
	}
	if f, ok := readPasswd(a.name); ok {
		a.uid, a.gid, a.home, a.shell = f.uid, f.gid, f.home, f.shell
	}
	a.groups = supplementaryGroups(a.name, a.gid)
	return a, nil
}

// readPasswd finds name in the passwd file.
func readPasswd(name string) (account, bool) {
	var a account
	found := false
	scanLines(passwdFile, func(f []string) bool {
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		a = account{name: name, uid: uint32(uid), gid: uint32(gid), home: f[5], shell: f[6]}
		found = true
		return false
	})
	return a, found
}

// supplementaryGroups lists the groups that name is a member of, and its
// primary group.
func supplementaryGroups(name string, gid uint32) []uint32 {
	groups := []uint32{gid}
	scanLines(groupFile, func(f []string) bool {
		if len(f) < 4 || !slices.Contains(strings.Split(f[3], ","), name) {
			return true
		}
		if g, err := strconv.ParseUint(f[2], 10, 32); err == nil && !slices.Contains(groups, uint32(g)) {
			groups = append(groups, uint32(g))
		}
		return true
	})
	return groups
}

// scanLines calls fn with each line's colon-separated fields until it
// returns false.
func scanLines(path string, fn func([]string) bool) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if !fn(strings.Split(sc.Text(), ":")) {
			return
		}
	}
}

func (a account) processUser() process.User {
	return process.User{Name: a.name, UID: a.uid, GID: a.gid, Groups: a.groups, Home: a.home, Shell: a.shell}
}

func (a account) filesUser() files.User {
	return files.User{Name: a.name, UID: a.uid, GID: a.gid, Groups: a.groups, Home: a.home}
}

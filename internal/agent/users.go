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

// lookupAccount resolves a wire user name ("" means the default user):
// "user" and "root" from /etc/passwd, falling back to uid/gid 1000 with
// home /home/user and 0/0 with /root when the template has no entry; any
// other name of /etc/passwd; or, as Docker's USER takes them, a numeric
// uid (its passwd entry if it has one, else home /) and either form with
// ":group" (a name of /etc/group or a numeric gid) replacing the primary
// group. Template builds run steps as whatever USER the recipe names.
func lookupAccount(name string) (account, error) {
	user, group, hasGroup := strings.Cut(name, ":")
	var a account
	switch user {
	case "", wire.UserDefault:
		a = account{name: wire.UserDefault, uid: 1000, gid: 1000, home: "/home/user", shell: "/bin/bash"}
	case wire.UserRoot:
		a = account{name: wire.UserRoot, home: "/root", shell: "/bin/bash"}
	}
	if a.home != "" {
		if f, ok := readPasswd(func(n string, _ uint32) bool { return n == a.name }); ok {
			a.uid, a.gid, a.home, a.shell = f.uid, f.gid, f.home, f.shell
		}
	} else if uid, err := strconv.ParseUint(user, 10, 32); err == nil {
		a = account{name: user, uid: uint32(uid), gid: uint32(uid), home: "/", shell: "/bin/sh"}
		if f, ok := readPasswd(func(_ string, u uint32) bool { return u == uint32(uid) }); ok {
			a = f
		}
	} else if f, ok := readPasswd(func(n string, _ uint32) bool { return n == user }); ok {
		a = f
	} else {
		return account{}, unknownUser(name)
	}
	if hasGroup {
		gid, ok := lookupGroup(group)
		if !ok {
			return account{}, unknownUser(name)
		}
		a.gid = gid
	}
	a.groups = supplementaryGroups(a.name, a.gid)
	return a, nil
}

func unknownUser(name string) error {
	return &api.Error{Code: api.CodeInvalidArgument,
		Message: "unknown user " + strconv.Quote(name) + ": want a user of the template's /etc/passwd or a uid[:gid]"}
}

// lookupGroup resolves a group name of /etc/group or a numeric gid.
func lookupGroup(group string) (uint32, bool) {
	if g, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(g), true
	}
	var gid uint32
	found := false
	scanLines(groupFile, func(f []string) bool {
		if len(f) < 3 || f[0] != group {
			return true
		}
		g, err := strconv.ParseUint(f[2], 10, 32)
		gid, found = uint32(g), err == nil
		return !found
	})
	return gid, found
}

// readPasswd finds the first entry of the passwd file that match
// accepts (by name and uid).
func readPasswd(match func(name string, uid uint32) bool) (account, bool) {
	var a account
	found := false
	scanLines(passwdFile, func(f []string) bool {
		if len(f) < 7 || f[0] == "" {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || !match(f[0], uint32(uid)) {
			return true
		}
		a = account{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5], shell: f[6]}
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

package files

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// names maps uids and gids to names from /etc/passwd and /etc/group,
// read once per operation.
type names struct {
	users, groups map[uint32]string
}

func loadNames() *names {
	return &names{users: readIDFile("/etc/passwd"), groups: readIDFile("/etc/group")}
}

// readIDFile reads "name:x:id:..." lines.
func readIDFile(path string) map[uint32]string {
	m := make(map[uint32]string)
	f, err := os.Open(path)
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 4)
		if len(parts) < 3 {
			continue
		}
		id, err := strconv.ParseUint(parts[2], 10, 32)
		if err != nil {
			continue
		}
		if _, dup := m[uint32(id)]; !dup {
			m[uint32(id)] = parts[0]
		}
	}
	return m
}

func (n *names) user(id uint32) string {
	if s, ok := n.users[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

func (n *names) group(id uint32) string {
	if s, ok := n.groups[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

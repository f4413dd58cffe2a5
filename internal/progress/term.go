package progress

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Terminal reports whether w is a terminal, and its width in columns (0
// when unknown).
func Terminal(w io.Writer) (width int, ok bool) {
	f, isFile := w.(*os.File)
	if !isFile {
		return 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	return int(ws.Col), true
}

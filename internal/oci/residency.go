package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pagesFile is the file of a runsc image dir that holds the memory pages
// (gVisor's checkpointfiles.PagesFileName); the sentry copies it into the
// restored sandbox's memory.
const pagesFile = "pages.img"

// RestoreDirect reports whether the image in imageDir should be restored
// with runsc's --direct (O_DIRECT reads of its pages file): when most of
// the pages file is not in the host's page cache. Read through the page
// cache, a cold image costs about twice as long on these hosts and its
// page cache is charged to the restoring sandbox's memory cgroup (a
// 256 MiB sandbox showed 550 MiB); a hot one is read from memory, and
// forks restored in parallel share it. Any doubt (no pages file, a file
// system without O_DIRECT, a failed probe) answers false: the default.
func RestoreDirect(imageDir string) bool {
	path := filepath.Join(imageDir, pagesFile)
	resident, total, err := residency(path)
	if err != nil || total == 0 || resident*2 >= total {
		return false
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return false // e.g. EINVAL: the file system has no O_DIRECT
	}
	f.Close()
	return true
}

// residency counts the pages of the file at path that are in the page
// cache, and its pages in all (mincore of a read-only shared mapping; the
// mapping touches nothing).
func residency(path string) (resident, total int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := st.Size()
	if size == 0 {
		return 0, 0, nil
	}
	if int64(int(size)) != size {
		return 0, 0, errors.New("file too large to map")
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("mapping %s: %w", filepath.Base(path), err)
	}
	defer unix.Munmap(mem)
	ps := os.Getpagesize()
	vec := make([]byte, (len(mem)+ps-1)/ps)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, 0, fmt.Errorf("mincore of %s: %w", filepath.Base(path), errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec), nil
}

package jupyter

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Limits on what the agent accepts from a kernel. A message larger than
// maxMessage is cut to exactly that size (what fits of a stream message's
// text is still forwarded; see salvageStream); one with more than
// maxFrames frames breaks the connection. maxMessage exceeds the
// per-execution output cap, so the cap, not this, decides what is shown.
const (
	maxMessage = 17 << 20
	maxFrames  = 64
)

// connInfo is a Jupyter connection file.
type connInfo struct {
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	IP              string `json:"ip"`
	Key             string `json:"key"`
	Transport       string `json:"transport"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// newConnInfo picks five free loopback ports and a random key.
func newConnInfo() (connInfo, error) {
	var ports [5]int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return connInfo{}, fmt.Errorf("picking a free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return connInfo{ShellPort: ports[0], IOPubPort: ports[1], StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4],
		IP: "127.0.0.1", Key: newID() + newID(), Transport: "tcp", SignatureScheme: "hmac-sha256"}, nil
}

// write writes the connection file into dir, readable only by uid/gid.
func (c connInfo) write(dir string, uid, gid uint32) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encoding connection file: %w", err)
	}
	path := filepath.Join(dir, "kernel.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("writing connection file: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(path, int(uid), int(gid)); err != nil {
			return "", fmt.Errorf("handing the connection file to uid %d: %w", uid, err)
		}
	}
	return path, nil
}

// endpoint names a port on the kernel for zmq4, through the limited
// transport.
func (c connInfo) endpoint(port int) string {
	return fmt.Sprintf("%s://%s", limitedTransport, net.JoinHostPort(c.IP, fmt.Sprint(port)))
}

// limitedTransport is TCP whose reads are checked by limitConn: zmq4
// itself allocates whatever length a frame header claims.
const limitedTransport = "kilntcp"

var registerOnce sync.Once

func registerTransport() {
	registerOnce.Do(func() {
		if err := zmq4.RegisterTransport(limitedTransport, limitTransport{transport.New("tcp")}); err != nil {
			panic(err) // only a duplicate name, which Once rules out
		}
	})
}

type limitTransport struct{ transport.Transport }

func (t limitTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &limitConn{Conn: c, br: bufio.NewReaderSize(c, 64<<10), greeting: 64, wgreeting: 64}, nil
}

// limitConn follows ZMTP 3 framing in what it reads (a 64-byte greeting,
// then frames of flags, a 1- or 8-byte length and a body) and cuts frames
// that would take a message past maxMessage, discarding the rest of their
// bodies, so that a peer cannot make the agent allocate without bound.
//
// It follows the framing of what it writes too, to send each message in
// one write: zmq4 writes every frame's header and body apart (its
// net.Buffers become one writev only on net's own conns, which this
// wrapper hides), so a Jupyter request of six frames took twelve writes,
// each a TCP segment and a wake-up of the kernel's I/O thread; under
// gVisor that was ~0.5 ms of a warm `1+1`.
type limitConn struct {
	net.Conn
	br *bufio.Reader

	wmu       sync.Mutex
	wgreeting int    // greeting bytes still to write through
	wbuf      []byte // the message being written, up to its last frame
	wframe    int    // where the frame being parsed starts in wbuf

	greeting int    // greeting bytes still to pass through
	pending  []byte // rewritten header bytes to hand out
	body     int64  // body bytes to pass through
	skip     int64  // body bytes to discard after those
	msgBytes int64  // bytes of the current message so far
	frames   int    // frames of the current message so far
	err      error
}

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

var errTooManyFrames = errors.New("kernel message has too many frames")

// Write passes the greeting through, then gathers frames until one ends
// its message (or is a command) and writes them at once.
func (c *limitConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	if c.wgreeting > 0 {
		g := min(len(b), c.wgreeting)
		m, err := c.Conn.Write(b[:g])
		c.wgreeting -= m
		if err != nil {
			return m, err
		}
		n, b = g, b[g:]
	}
	c.wbuf = append(c.wbuf, b...)
	for {
		end, ok := frameEnd(c.wbuf[c.wframe:])
		if !ok {
			return n + len(b), nil
		}
		last := c.wbuf[c.wframe]&(flagMore|flagCommand) != flagMore
		c.wframe += end
		if !last {
			continue
		}
		if _, err := c.Conn.Write(c.wbuf[:c.wframe]); err != nil {
			return n, err
		}
		rest := copy(c.wbuf, c.wbuf[c.wframe:])
		c.wbuf, c.wframe = c.wbuf[:rest], 0
		if cap(c.wbuf) > 1<<20 { // a large message's buffer is not kept
			c.wbuf = append([]byte(nil), c.wbuf...)
		}
	}
}

// frameEnd is the length of the ZMTP frame that b starts with, if b holds
// all of it.
func frameEnd(b []byte) (int, bool) {
	if len(b) < 2 {
		return 0, false
	}
	head, size := 2, uint64(b[1])
	if b[0]&flagLong != 0 {
		if len(b) < 9 {
			return 0, false
		}
		head, size = 9, binary.BigEndian.Uint64(b[1:9])
	}
	if size > uint64(len(b)-head) {
		return 0, false
	}
	return head + int(size), true
}

func (c *limitConn) Read(b []byte) (int, error) {
	for {
		switch {
		case c.err != nil:
			return 0, c.err
		case len(c.pending) > 0:
			n := copy(b, c.pending)
			c.pending = c.pending[n:]
			return n, nil
		case c.greeting > 0:
			n, err := c.br.Read(b[:min(len(b), c.greeting)])
			c.greeting -= n
			return n, err
		case c.body > 0:
			n, err := c.br.Read(b[:min(int64(len(b)), c.body)])
			c.body -= int64(n)
			return n, err
		case c.skip > 0:
			n, err := c.br.Discard(int(min(c.skip, 1<<20)))
			c.skip -= int64(n)
			if err != nil {
				return 0, err
			}
			continue
		}
		c.err = c.nextHeader()
	}
}

// nextHeader reads one frame header and decides whether its body passes.
func (c *limitConn) nextHeader() error {
	flags, err := c.br.ReadByte()
	if err != nil {
		return err
	}
	var size uint64
	if flags&flagLong != 0 {
		var l [8]byte
		if _, err := io.ReadFull(c.br, l[:]); err != nil {
			return err
		}
		size = binary.BigEndian.Uint64(l[:])
	} else {
		s, err := c.br.ReadByte()
		if err != nil {
			return err
		}
		size = uint64(s)
	}
	c.frames++
	if c.frames > maxFrames {
		return errTooManyFrames
	}
	if flags&flagMore == 0 || flags&flagCommand != 0 {
		defer func() { c.frames, c.msgBytes = 0, 0 }()
	}
	if keep := uint64(maxMessage - c.msgBytes); size > keep {
		// Cut the frame: the message no longer verifies, and decode marks
		// it Oversize by its total of exactly maxMessage bytes.
		c.skip = int64(min(size-keep, 1<<62))
		size = keep
		flags |= flagLong
	}
	c.msgBytes += int64(size)
	c.body = int64(size)
	if flags&flagLong != 0 {
		c.pending = binary.BigEndian.AppendUint64([]byte{flags}, size)
	} else {
		c.pending = []byte{flags, byte(size)}
	}
	return nil
}

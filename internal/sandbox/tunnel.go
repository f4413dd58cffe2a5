package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// Tunnel connects to port on the sandbox's loopback through the agent
// channel (wire.MethodTunnel): it reaches servers bound to 127.0.0.1 and
// sandboxes without a network. The connection's bytes are flow-controlled
// like every channel stream; deadlines are not supported (Set*Deadline do
// nothing), so callers bound their use with ctx-aware reads of their own.
func (a *Agent) Tunnel(ctx context.Context, port int) (net.Conn, error) {
	st, err := a.conn.Call(ctx, wire.MethodTunnel, wire.TunnelParams{Port: port})
	if err != nil {
		return nil, agentError(err)
	}
	// The first frame is the open event, or the end with the agent's error.
	f, err := st.Recv(ctx)
	if err != nil {
		st.Close()
		if errors.Is(err, io.EOF) {
			err = errors.New("tunnel ended before it opened")
		}
		return nil, agentError(err)
	}
	if f.Type != channel.FrameEvent {
		st.Close()
		return nil, fmt.Errorf("tunnel: unexpected first frame")
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &tunnelConn{st: st, ctx: tctx, cancel: cancel, port: port}, nil
}

// tunnelConn is a net.Conn over a tunnel stream.
type tunnelConn struct {
	st     *channel.Stream
	ctx    context.Context
	cancel context.CancelFunc
	port   int

	rmu sync.Mutex
	buf []byte

	closeOnce sync.Once
}

var _ net.Conn = (*tunnelConn)(nil)

func (c *tunnelConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		f, err := c.st.Recv(c.ctx)
		if err != nil {
			if errors.Is(err, io.EOF) || c.ctx.Err() != nil {
				return 0, io.EOF
			}
			return 0, err
		}
		if f.Type == channel.FrameData {
			c.buf = f.Payload
		}
	}
	n := copy(b, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *tunnelConn) Write(b []byte) (int, error) {
	if err := c.st.SendData(c.ctx, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite ends the host's half: the sandbox's server reads EOF.
func (c *tunnelConn) CloseWrite() error { return c.st.CloseSend() }

func (c *tunnelConn) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		c.st.Close()
	})
	return nil
}

type tunnelAddr int

func (a tunnelAddr) Network() string { return "kiln-tunnel" }
func (a tunnelAddr) String() string  { return fmt.Sprintf("127.0.0.1:%d", int(a)) }

func (c *tunnelConn) LocalAddr() net.Addr              { return tunnelAddr(0) }
func (c *tunnelConn) RemoteAddr() net.Addr             { return tunnelAddr(c.port) }
func (c *tunnelConn) SetDeadline(time.Time) error      { return nil }
func (c *tunnelConn) SetReadDeadline(time.Time) error  { return nil }
func (c *tunnelConn) SetWriteDeadline(time.Time) error { return nil }

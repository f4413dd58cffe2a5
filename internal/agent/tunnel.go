package agent

import (
	"context"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// tunnel connects to a port on the sandbox's loopback and pipes the
// stream to it both ways (wire.MethodTunnel). It returns when the port's
// side closes; the host's half ending only closes the connection's write
// side, so a server can still answer.
func (s *Server) tunnel(ctx context.Context, st *channel.Stream, p wire.TunnelParams) error {
	if p.Port < 1 || p.Port > 65535 {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "port " + strconv.Itoa(p.Port) + " outside 1-65535"}
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)))
	cancel()
	if err != nil {
		return &api.Error{Code: api.CodeUnavailable, Message: "connecting to port " + strconv.Itoa(p.Port) + ": " + err.Error()}
	}
	defer c.Close()
	if err := st.SendEvent(ctx, wire.TunnelOpen{Open: true}); err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(c, &streamReader{ctx: ctx, st: st})
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if serr := st.SendData(ctx, buf[:n]); serr != nil {
				return serr
			}
		}
		if err != nil {
			return nil // the port's side closed (or reset): the call ends
		}
	}
}

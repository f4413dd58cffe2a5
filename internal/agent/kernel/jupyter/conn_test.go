package jupyter

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// writeCounter counts the writes that reach a real connection.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (w writeCounter) Write(b []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(b)
}

// countingTCP is TCP whose dialled conns count their writes in writes.
type countingTCP struct {
	transport.Transport
	writes *atomic.Int64
}

func (t countingTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return writeCounter{c, t.writes}, nil
}

var (
	countedWrites  atomic.Int64
	registerCounts sync.Once
)

// The agent's side of a kernel connection writes each ZMTP message in
// one write: zmq4 writes a frame's header and body apart (twelve writes
// for a six-frame Jupyter request, each a TCP segment and a wake-up of
// the kernel's I/O thread, which under gVisor cost ~0.5 ms of a `1+1`).
// Through real zmq4 sockets on both ends (the handshake, then messages
// of every size class, by both of zmq4's send paths) every message still
// arrives whole.
func TestLimitConnWritesMessagesWhole(t *testing.T) {
	registerCounts.Do(func() {
		if err := zmq4.RegisterTransport("kilncount", limitTransport{countingTCP{transport.New("tcp"), &countedWrites}}); err != nil {
			t.Fatal(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(discardLog))
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	dealer := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("agent")), zmq4.WithLogger(discardLog))
	defer dealer.Close()
	if err := dealer.Dial("kilncount://" + router.Addr().String()); err != nil {
		t.Fatal(err)
	}

	_, request, err := signer{key: []byte("k")}.encode("s", "execute_request", executeRequest{Code: "1+1"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		frames [][]byte
	}{
		{"jupyter request", request},
		{"one frame", [][]byte{[]byte("x")}},
		{"empty frames", [][]byte{{}, {}, []byte("end")}},
		{"long frame", [][]byte{[]byte("head"), bytes.Repeat([]byte("a"), 300)}},
		{"frame of 2 MiB", [][]byte{bytes.Repeat([]byte("b"), 2<<20), []byte("tail")}},
	}
	sends := []struct {
		name string
		send func(zmq4.Msg) error
	}{
		{"SendMulti", dealer.SendMulti}, // all frames as one net.Buffers
		{"Send", dealer.Send},           // frame by frame, header and body apart
	}
	for _, tt := range tests {
		for _, s := range sends {
			t.Run(tt.name+"/"+s.name, func(t *testing.T) {
				before := countedWrites.Load()
				if err := s.send(zmq4.NewMsgFrom(tt.frames...)); err != nil {
					t.Fatalf("send: %v", err)
				}
				got, err := router.Recv()
				if err != nil {
					t.Fatalf("receive: %v", err)
				}
				// The router puts the sender's identity first.
				if len(got.Frames) != len(tt.frames)+1 || string(got.Frames[0]) != "agent" || !equalFrames(got.Frames[1:], tt.frames) {
					t.Fatalf("received %d frames, not the %d sent", len(got.Frames)-1, len(tt.frames))
				}
				if n := countedWrites.Load() - before; n != 1 {
					t.Errorf("the message took %d writes, want 1", n)
				}
			})
		}
	}
}

func equalFrames(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

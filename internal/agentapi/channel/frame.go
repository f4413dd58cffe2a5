// Package channel is the transport between kiln serve and kiln-agent: many
// concurrent, flow-controlled streams multiplexed over one pair of byte
// pipes (the agent's stdin and stdout).
//
// The pipes outlive either end's sessions: kiln serve may crash mid-frame
// and a restored checkpoint resumes mid-frame, so frames are
// self-synchronising (magic, length, CRC) and each host connection starts a
// new session with a Hello that the agent acknowledges. Everything before
// the matching HelloAck is discarded.
//
// This package runs on both sides of the trust boundary; it imports only
// the standard library.
package channel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// FrameType says what a frame carries.
type FrameType byte

const (
	frameHello    FrameType = 1 // host→agent: JSON hello, starts a session
	frameHelloAck FrameType = 2 // agent→host: JSON hello echoing the session
	frameCall     FrameType = 3 // host→agent: JSON call, opens a stream
	FrameEvent    FrameType = 4 // either way: JSON payload
	FrameData     FrameType = 5 // either way: raw bytes
	frameEnd      FrameType = 6 // either way: JSON end, closes the sender's half
	frameCancel   FrameType = 7 // host→agent: abort the stream
	frameCredit   FrameType = 8 // either way: 4-byte window update
)

const (
	headerSize = 20
	// MaxPayload bounds one frame; larger writes are split.
	MaxPayload = 256 << 10
	// padSize bytes of zeros complete any frame a crashed writer left
	// half-written, so the reader can resynchronise on the next magic.
	padSize = headerSize + MaxPayload
)

var (
	magic      = [4]byte{'K', 'L', 'N', '1'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// flagMore marks an event frame whose payload continues in the stream's
// next event frame: events larger than MaxPayload travel in pieces.
const flagMore = 0x01

// MaxEvent bounds an event reassembled from pieces.
const MaxEvent = 32 << 20

// Frame is one unit on the wire.
type Frame struct {
	Type    FrameType
	Stream  uint32
	Payload []byte
	more    bool // flagMore
	cost    int  // flow-control cost still to be credited when consumed
}

// appendFrame encodes f onto b.
func appendFrame(b []byte, f Frame) []byte {
	var h [headerSize]byte
	copy(h[:4], magic[:])
	h[4] = byte(f.Type)
	if f.more {
		h[5] = flagMore
	}
	binary.BigEndian.PutUint32(h[8:12], f.Stream)
	binary.BigEndian.PutUint32(h[12:16], uint32(len(f.Payload)))
	crc := crc32.Update(0, castagnoli, h[4:16])
	crc = crc32.Update(crc, castagnoli, f.Payload)
	binary.BigEndian.PutUint32(h[16:20], crc)
	b = append(b, h[:]...)
	return append(b, f.Payload...)
}

// frameReader decodes frames, skipping garbage until a valid frame.
type frameReader struct {
	br      *bufio.Reader
	skipped int64 // bytes discarded while resynchronising, for diagnostics
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(r, headerSize+MaxPayload)}
}

// next returns the next valid frame. Its payload is a fresh slice.
func (fr *frameReader) next() (Frame, error) {
	for {
		if err := fr.syncMagic(); err != nil {
			return Frame{}, err
		}
		h, err := fr.br.Peek(headerSize)
		if err != nil {
			return Frame{}, err
		}
		n := binary.BigEndian.Uint32(h[12:16])
		if n > MaxPayload || h[5]&^flagMore != 0 || h[6] != 0 || h[7] != 0 {
			fr.discard(1)
			continue
		}
		buf, err := fr.br.Peek(headerSize + int(n))
		if err != nil {
			return Frame{}, err
		}
		crc := crc32.Update(0, castagnoli, buf[4:16])
		crc = crc32.Update(crc, castagnoli, buf[headerSize:])
		if crc != binary.BigEndian.Uint32(buf[16:20]) {
			fr.discard(1)
			continue
		}
		f := Frame{
			Type:    FrameType(buf[4]),
			Stream:  binary.BigEndian.Uint32(buf[8:12]),
			Payload: bytes.Clone(buf[headerSize:]),
			more:    buf[5]&flagMore != 0,
		}
		if f.Payload == nil {
			f.Payload = []byte{}
		}
		fr.discard(headerSize + int(n))
		return f, nil
	}
}

// syncMagic discards bytes until the buffer starts with the magic.
func (fr *frameReader) syncMagic() error {
	for {
		b, err := fr.br.Peek(len(magic))
		if err != nil {
			return err
		}
		if bytes.Equal(b, magic[:]) {
			return nil
		}
		// Skip as much of the buffered garbage as possible in one go.
		buf, _ := fr.br.Peek(fr.br.Buffered())
		i := bytes.Index(buf[1:], magic[:1])
		if i < 0 {
			fr.discard(len(buf))
		} else {
			fr.discard(i + 1)
		}
	}
}

func (fr *frameReader) discard(n int) {
	d, _ := fr.br.Discard(n)
	fr.skipped += int64(d)
}

func (t FrameType) String() string {
	switch t {
	case frameHello:
		return "hello"
	case frameHelloAck:
		return "hello-ack"
	case frameCall:
		return "call"
	case FrameEvent:
		return "event"
	case FrameData:
		return "data"
	case frameEnd:
		return "end"
	case frameCancel:
		return "cancel"
	case frameCredit:
		return "credit"
	}
	return fmt.Sprintf("frame(%d)", byte(t))
}

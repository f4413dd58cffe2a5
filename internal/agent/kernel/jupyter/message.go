package jupyter

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// protocolVersion is the Jupyter messaging protocol spoken.
const protocolVersion = "5.3"

// delimiter separates routing identities from a message's frames.
var delimiter = []byte("<IDS|MSG>")

// header is a Jupyter message header.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is a decoded Jupyter message. Content stays raw until its type
// is known.
type message struct {
	Header  header
	Parent  header
	Content json.RawMessage
	// Metadata stays raw: only timing measurements read it.
	Metadata json.RawMessage
	// Received is when the agent decoded the message.
	Received time.Time
	// Oversize marks a message cut in transit because it exceeded the
	// size limit (see limitConn): it is unverified, and its content is a
	// prefix of the original.
	Oversize bool
}

// signer signs and verifies messages with HMAC-SHA256.
type signer struct{ key []byte }

func (s signer) sign(frames ...[]byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, f := range frames {
		m.Write(f)
	}
	sum := m.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// encode builds the frames of a message sent by this client (a DEALER,
// so no routing identities).
func (s signer) encode(session, msgType string, content any) (id string, frames [][]byte, err error) {
	id = newID()
	h := header{MsgID: id, Session: session, Username: "kiln", Date: time.Now().UTC().Format(time.RFC3339Nano),
		MsgType: msgType, Version: protocolVersion}
	hb, err := json.Marshal(h)
	if err != nil {
		return "", nil, fmt.Errorf("encoding header: %w", err)
	}
	cb, err := json.Marshal(content)
	if err != nil {
		return "", nil, fmt.Errorf("encoding %s: %w", msgType, err)
	}
	parent, meta := []byte("{}"), []byte("{}")
	return id, [][]byte{delimiter, s.sign(hb, parent, meta, cb), hb, parent, meta, cb}, nil
}

var errBadSignature = errors.New("message signature does not verify")

// decode parses and verifies a received message: [identities...,
// delimiter, signature, header, parent_header, metadata, content,
// buffers...].
func (s signer) decode(frames [][]byte) (message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return message{}, fmt.Errorf("decoding message: %d frames after the delimiter, want at least 6", len(frames)-i)
	}
	sig, h, p, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	var m message
	if !hmac.Equal(sig, s.sign(h, p, meta, content)) {
		// limitConn cuts messages to exactly maxMessage bytes; such a
		// message cannot verify, but its headers still say where it
		// belongs.
		total := 0
		for _, f := range frames {
			total += len(f)
		}
		if total != maxMessage {
			return message{}, errBadSignature
		}
		m.Oversize = true
	}
	if err := json.Unmarshal(h, &m.Header); err != nil {
		return message{}, fmt.Errorf("decoding header: %w", err)
	}
	if err := json.Unmarshal(p, &m.Parent); err != nil {
		return message{}, fmt.Errorf("decoding parent header: %w", err)
	}
	m.Content, m.Metadata, m.Received = content, meta, time.Now()
	return m, nil
}

// newID returns a random message or session id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

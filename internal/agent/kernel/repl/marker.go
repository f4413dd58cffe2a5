package repl

import "bytes"

// Output is framed with sync markers the interpreter prints after each
// cell, "\x02kiln-<token>-<payload>\x03", so that the end of a cell's
// output on a pipe is known even though stdout, stderr and the control
// channel are separate pipes read concurrently. The token is random per
// interpreter, so cell output cannot forge a marker by accident.

const (
	markStart = 0x02
	markEnd   = 0x03
	// maxPayload bounds how long a marker may be before its end byte;
	// a longer "marker" is ordinary output.
	maxPayload = 128
)

func markerPrefix(token string) []byte { return []byte("\x02kiln-" + token + "-") }

// splitter separates sync markers from the data of one output stream. It
// holds back only a trailing partial marker, so output flows live.
type splitter struct {
	prefix []byte
	buf    []byte
}

// feed consumes p and calls data and marker, in stream order. The slices
// passed to data are fresh copies.
func (s *splitter) feed(p []byte, data func([]byte), marker func(string)) {
	s.buf = append(s.buf, p...)
	for len(s.buf) > 0 {
		i := bytes.Index(s.buf, s.prefix)
		if i < 0 {
			keep := partialSuffix(s.buf, s.prefix)
			s.emit(len(s.buf)-keep, data)
			return
		}
		rest := s.buf[i+len(s.prefix):]
		j := bytes.IndexByte(rest, markEnd)
		if j < 0 && len(rest) <= maxPayload {
			s.emit(i, data) // wait for the rest of the marker
			return
		}
		if j < 0 || j > maxPayload {
			s.emit(i+1, data) // not a marker after all
			continue
		}
		s.emit(i, data)
		marker(string(s.buf[len(s.prefix) : len(s.prefix)+j]))
		s.buf = s.buf[len(s.prefix)+j+1:]
	}
}

// emit passes on the first n bytes of the buffer and keeps the rest.
func (s *splitter) emit(n int, data func([]byte)) {
	if n > 0 {
		data(bytes.Clone(s.buf[:n]))
	}
	s.buf = append(s.buf[:0:0], s.buf[n:]...)
}

// partialSuffix is the length of the longest proper prefix of prefix that
// b ends with.
func partialSuffix(b, prefix []byte) int {
	start := max(len(b)-len(prefix)+1, 0)
	for i := start; i < len(b); i++ {
		if b[i] == markStart && bytes.HasPrefix(prefix, b[i:]) {
			return len(b) - i
		}
	}
	return 0
}

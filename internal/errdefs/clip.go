package errdefs

import "unicode/utf8"

// MaxEcho is the most of one caller's input an error message quotes.
const MaxEcho = 200

// Clip cuts a caller's input for quoting in an error message: at most
// MaxEcho bytes, on a rune boundary, with "…" when cut. Every error that
// echoes what a caller sent (names, paths, ids, values) quotes it through
// Clip, so a 100 KB input never comes back in full.
func Clip(s string) string {
	return ClipN(s, MaxEcho)
}

// ClipN is Clip with a limit of n bytes.
func ClipN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ClipMessage bounds a whole error message to about n bytes, keeping its
// beginning and its end (which says what went wrong) and cutting the
// middle: a backstop for inputs quoted without Clip.
func ClipMessage(s string, n int) string {
	if len(s) <= n {
		return s
	}
	tail := n / 4
	i := len(s) - tail
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return ClipN(s, n-tail) + s[i:]
}

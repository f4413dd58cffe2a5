package envd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// frame is one Connect streaming envelope.
type frame struct {
	flags byte
	body  map[string]any
}

// rawStream posts one enveloped JSON message to a server-streaming RPC,
// byte for byte as the JS SDK does, and returns the response and a
// reader of its frames.
func (e *env) rawStream(t *testing.T, ctx context.Context, procedure, msg string, hdr ...string) (*http.Response, func() (frame, error)) {
	t.Helper()
	var body bytes.Buffer
	body.WriteByte(0)
	binary.Write(&body, binary.BigEndian, uint32(len(msg)))
	body.WriteString(msg)
	req, err := http.NewRequestWithContext(ctx, "POST", e.url+procedure, &body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
		"Connect-Timeout-Ms": "60000", "Keepalive-Ping-Interval": "50", "X-Access-Token": e.token,
		"Accept-Encoding": "gzip, deflate", "E2b-Sandbox-Port": "49983",
	} {
		req.Header.Set(k, v)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	r := bufio.NewReader(res.Body)
	return res, func() (frame, error) {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return frame{}, err
		}
		b := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(r, b); err != nil {
			return frame{}, err
		}
		f := frame{flags: hdr[0]}
		if err := json.Unmarshal(b, &f.body); err != nil {
			return frame{}, err
		}
		return f, nil
	}
}

func jsonOf(t *testing.T, s string) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWire checks the bytes envd's clients see: the SDK's captured Start
// request, proto3-JSON events (oneofs by member, bytes as base64,
// lowerCamelCase, int64 as a string) and the end-of-stream frame; and
// that a sandbox killed mid-stream breaks the connection instead of
// ending the stream cleanly.
func TestWire(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	ctx := ctxTimeout(t, time.Minute)

	t.Run("Start", func(t *testing.T) {
		res, next := e.rawStream(t, ctx, "/process.Process/Start",
			`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hello; exit 3"],"envs":{"X":"1"},"cwd":"/tmp"},"stdin":false}`)
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/connect+json" || res.Header.Get("Content-Encoding") != "" {
			t.Fatalf("status %d, headers %v", res.StatusCode, res.Header)
		}
		var frames []frame
		for {
			f, err := next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, f)
		}
		if len(frames) != 4 {
			t.Fatalf("frames %+v", frames)
		}
		start, ok := frames[0].body["event"].(map[string]any)["start"].(map[string]any)
		if !ok || start["pid"].(float64) <= 0 {
			t.Errorf("first frame %v", frames[0].body)
		}
		want := []frame{
			{0, jsonOf(t, `{"event":{"data":{"stdout":"`+base64.StdEncoding.EncodeToString([]byte("hello\n"))+`"}}}`)},
			{0, jsonOf(t, `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}`)},
			{2, map[string]any{}},
		}
		if !reflect.DeepEqual(frames[1:], want) {
			t.Errorf("frames %+v\nwant %+v", frames[1:], want)
		}
	})

	// The deadline kills the process and ends the stream as
	// deadline_exceeded, with no end event, even for a client that does
	// not time out by itself (the SDK's timer may fire late).
	t.Run("deadline", func(t *testing.T) {
		_, next := e.rawStream(t, ctx, "/process.Process/Start", `{"process":{"cmd":"/bin/bash","args":["-l","-c","sleep 600"]},"stdin":false}`,
			"Connect-Timeout-Ms", "1500")
		var frames []frame
		for {
			f, err := next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.body["event"] == nil || f.body["event"].(map[string]any)["keepalive"] == nil {
				frames = append(frames, f)
			}
		}
		last := frames[len(frames)-1]
		code, _ := last.body["error"].(map[string]any)["code"].(string)
		if len(frames) != 2 || frames[0].body["event"].(map[string]any)["start"] == nil || last.flags != 2 || code != "deadline_exceeded" {
			t.Fatalf("frames %+v", frames)
		}
	})

	t.Run("ListDir", func(t *testing.T) {
		e.sh(t, "", "mkdir -p /tmp/w && printf 12345 > /tmp/w/a.txt")
		res, b := e.do(t, "POST", "/filesystem.Filesystem/ListDir",
			map[string]string{"Content-Type": "application/json", "X-Access-Token": e.token}, bytes.NewReader([]byte(`{"path":"/tmp/w","depth":1}`)))
		var got struct{ Entries []map[string]any }
		if res.StatusCode != 200 || json.Unmarshal(b, &got) != nil || len(got.Entries) != 1 {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		en := got.Entries[0]
		delete(en, "modifiedTime")
		want := jsonOf(t, `{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/tmp/w/a.txt","size":"5","mode":420,"permissions":"-rw-r--r--","owner":"user","group":"user"}`)
		if !reflect.DeepEqual(en, want) {
			t.Errorf("entry %v\nwant %v", en, want)
		}
	})

	t.Run("killed mid-stream", func(t *testing.T) {
		_, next := e.rawStream(t, ctx, "/process.Process/Start", `{"process":{"cmd":"/bin/bash","args":["-l","-c","sleep 600"]},"stdin":false}`)
		if f, err := next(); err != nil || f.body["event"].(map[string]any)["start"] == nil {
			t.Fatalf("first frame %v, %v", f, err)
		}
		kill, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.m.Kill(kill, e.sb.ID); err != nil {
			t.Fatal(err)
		}
		f, err := next()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("after the kill: frame %+v, error %v; want the connection broken (unexpected EOF)", f, err)
		}
		res, _ := e.do(t, "GET", "/health", nil, nil)
		if res.StatusCode != http.StatusBadGateway {
			t.Errorf("/health of a killed sandbox: %d", res.StatusCode)
		}
	})
}

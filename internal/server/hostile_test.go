package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// maxMessage is the most of an error message a client may get back.
const maxMessage = 1100

// TestHostileInput sends what a hostile client would to a real sandbox:
// each request is refused with a 4xx and a short message, none hangs,
// and nothing is written where the request said it must not be. The E2B
// routes' twin is envd's TestHostileInput.
func TestHostileInput(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	call := func(t *testing.T, method, path string, body io.Reader, hdr ...string) (int, api.Error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, h.ts.URL+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+h.a)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (hung?)", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e api.Error
		_ = json.Unmarshal(b, &e)
		if resp.StatusCode >= 400 && e.Message == "" {
			t.Errorf("%s %s: %d with body %.200q, want an api.Error", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode, e
	}
	setup := `mkfifo /tmp/fifo && printf '#!/bin/sh\necho ran\n' >/tmp/noexec.sh && chmod 644 /tmp/noexec.sh && mkdir -p /tmp/up`
	b, _ := json.Marshal(api.CommandRequest{Cmd: setup, User: "root"})
	resp := h.request("POST", base+"/commands", h.a, bytes.NewReader(b), "Accept", "application/json")
	var res api.CommandResult
	json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != 200 || res.Exit.Code != 0 {
		t.Fatalf("setup: %d %+v", resp.StatusCode, res)
	}
	cmd := func(req string) func() io.Reader { return func() io.Reader { return strings.NewReader(req) } }
	huge := strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		name, method, path string
		body               func() io.Reader
		hdr                []string
		status             int
		msg                string
	}{
		{"reserved env", "POST", "/commands", cmd(`{"args":["true"],"env":{"KILN_X":"1"}}`), nil, 400, "KILN_"},
		{"= in env name", "POST", "/commands", cmd(`{"args":["true"],"env":{"A=B":"1"}}`), nil, 400, "'='"},
		{"empty env name", "POST", "/commands", cmd(`{"args":["true"],"env":{"":"1"}}`), nil, 400, "1-256"},
		{"100 KB env name", "POST", "/commands", cmd(`{"args":["true"],"env":{"` + huge + `":"1"}}`), nil, 400, "1-256"},
		{"100 KB tag", "POST", "/commands", cmd(`{"args":["true"],"tag":"` + huge + `"}`), nil, 400, "tag"},
		{"non-executable file", "POST", "/commands", cmd(`{"args":["/tmp/noexec.sh"]}`), nil, 403, "not executable"},
		{"directory as program", "POST", "/commands", cmd(`{"args":["/tmp"]}`), nil, 400, "directory"},
		{"100 KB program name", "POST", "/commands", cmd(`{"args":["/no/` + huge + `"]}`), nil, 404, "not found"},
		{"FIFO without writer", "GET", "/files?path=/tmp/fifo", nil, nil, 400, "not a regular file"},
		{"/proc/self/mem", "GET", "/files?path=/proc/self/mem&user=root", nil, nil, 0, ""},
		{"/dev/tty", "GET", "/files?path=/dev/tty&user=root", nil, nil, 0, ""},
		{"device", "GET", "/files?path=/dev/zero", nil, nil, 400, "not a regular file"},
		{"/proc/sys write", "PUT", "/files?path=/proc/sys/kernel/hostname&user=root", cmd("evil"), nil, 0, ""},
		{"path ending in /", "PUT", "/files?path=/tmp/newdir/", cmd("x"), nil, 400, "ending in /"},
		{"upload ../", "POST", "/files?dir=/tmp/up", multipartOf(t, "../escaped.txt"), nil, 400, ".."},
		{"upload a/../../", "POST", "/files?dir=/tmp/up", multipartOf(t, "a/../../escaped.txt"), nil, 400, ".."},
		{"upload ../ without dir", "POST", "/files", multipartOf(t, "../../../tmp/escaped.txt"), nil, 400, ".."},
		{"1,001 files", "POST", "/files?dir=/tmp/many", multipartOf(t, manyNames(1001)...), nil, 400, "more than 1000 files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			hdr := tc.hdr
			if tc.body != nil {
				body = tc.body()
				if mb, ok := body.(*multipartBody); ok {
					hdr = append(hdr, "Content-Type", mb.ctype)
				}
			}
			status, e := call(t, tc.method, base+tc.path, body, hdr...)
			switch {
			case tc.status == 0 && (status < 400 || status >= 500):
				t.Errorf("status %d (%s), want 4xx", status, e.Message)
			case tc.status != 0 && (status != tc.status || !strings.Contains(e.Message, tc.msg)):
				t.Errorf("%d %q, want %d with %q", status, e.Message, tc.status, tc.msg)
			}
			if len(e.Message) > maxMessage {
				t.Errorf("message of %d bytes: %.100q…", len(e.Message), e.Message)
			}
		})
	}
	// Nothing was written where the refused requests pointed.
	for _, p := range []string{"/tmp/newdir", "/tmp/escaped.txt", "/tmp/up/escaped.txt", "/escaped.txt"} {
		if status, e := call(t, "GET", base+"/files/stat?path="+p+"&user=root", nil); status != 404 {
			t.Errorf("%s: stat %d %+v, want 404: a refused request wrote it", p, status, e)
		}
	}
	t.Run("disk_bytes 2^63-1", func(t *testing.T) {
		status, e := call(t, "POST", "/v1/sandboxes", strings.NewReader(fmt.Sprintf(`{"limits":{"disk_bytes":%d}}`, int64(math.MaxInt64))))
		if status != 400 || !strings.Contains(e.Message, strconv.FormatInt(math.MaxInt64, 10)) || strings.Contains(e.Message, "-") {
			t.Errorf("%d %q, want 400 quoting %d", status, e.Message, int64(math.MaxInt64))
		}
	})
}

// multipartBody is a multipart upload with its content type.
type multipartBody struct {
	*bytes.Reader
	ctype string
}

// multipartOf is a multipart body with one small file part per name.
func multipartOf(t *testing.T, names ...string) func() io.Reader {
	return func() io.Reader {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for _, n := range names {
			w, err := mw.CreateFormFile("file", n)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(w, "x")
		}
		mw.Close()
		return &multipartBody{bytes.NewReader(buf.Bytes()), mw.FormDataContentType()}
	}
}

func manyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "f" + strconv.Itoa(i)
	}
	return names
}

package envd_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
)

// do sends a plain HTTP request to the envd handler; header values are
// set verbatim (no automatic gzip).
func (e *env) do(t testing.TB, method, target string, hdr map[string]string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxTimeout(t, time.Minute), method, e.url+target, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

const msgUnauthorized = `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}`

func TestAccessToken(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	tok := map[string]string{"X-Access-Token": e.token}
	bad := map[string]string{"X-Access-Token": "wrong"}
	rpc := map[string]string{"Content-Type": "application/json"}
	with := func(a, b map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range a {
			m[k] = v
		}
		for k, v := range b {
			m[k] = v
		}
		return m
	}
	envJSON, _ := json.Marshal(e.sb.Env) // the template's and the create request's
	if e.sb.Env["SANDBOX_GLOBAL"] != "from-create" {
		t.Fatalf("sandbox env %v", e.sb.Env)
	}
	tests := []struct {
		name, method, target string
		hdr                  map[string]string
		body                 string
		status               int
		wantBody             string
	}{
		{"health needs no token", "GET", "/health", nil, "", http.StatusNoContent, ""},
		{"CORS preflight", "OPTIONS", "/process.Process/Start", map[string]string{"Origin": "https://app.example",
			"Access-Control-Request-Method": "POST"}, "", http.StatusNoContent, ""},
		{"RPC without a token", "POST", "/process.Process/List", rpc, "{}", http.StatusUnauthorized, msgUnauthorized},
		{"RPC with a wrong token", "POST", "/process.Process/List", with(rpc, bad), "{}", http.StatusUnauthorized, msgUnauthorized},
		{"RPC with the token", "POST", "/process.Process/List", with(rpc, tok), "{}", http.StatusOK, ""},
		{"envs without a token", "GET", "/envs", nil, "", http.StatusUnauthorized, msgUnauthorized},
		{"envs", "GET", "/envs", tok, "", http.StatusOK, string(envJSON)},
		{"files without token or signature", "GET", "/files?path=/etc/passwd", nil, "", http.StatusUnauthorized,
			`{"code":401,"message":"missing signature query parameter"}`},
		{"files with a wrong token", "GET", "/files?path=/etc/passwd", bad, "", http.StatusUnauthorized,
			`{"code":401,"message":"access token present in header but does not match"}`},
		{"unknown username on files", "GET", "/files?path=/etc/passwd&username=nobody", tok, "", http.StatusUnauthorized,
			`{"code":401,"message":"error looking up user 'nobody': unknown user"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, b := e.do(t, tt.method, tt.target, tt.hdr, strings.NewReader(tt.body))
			if res.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, b, tt.status)
			}
			if tt.wantBody != "" && strings.TrimSpace(string(b)) != tt.wantBody {
				t.Errorf("body %s\nwant %s", b, tt.wantBody)
			}
			if res.Header.Get("Access-Control-Allow-Origin") != "*" {
				t.Errorf("Access-Control-Allow-Origin %q", res.Header.Get("Access-Control-Allow-Origin"))
			}
			if tt.status == http.StatusUnauthorized && res.Header.Get("Content-Type") != "application/json; charset=utf-8" {
				t.Errorf("content type %q", res.Header.Get("Content-Type"))
			}
		})
	}
	t.Run("RPC error body", func(t *testing.T) {
		_, b := e.do(t, "POST", "/filesystem.Filesystem/Stat", with(rpc, tok), strings.NewReader(`{"path":"/nope"}`))
		var got struct{ Code, Message string }
		if err := json.Unmarshal(b, &got); err != nil || got.Code != "not_found" || !strings.Contains(got.Message, "/nope") {
			t.Errorf("body %s", b)
		}
	})
}

// multipartBody builds an SDK-style upload form: one "file" part per
// name, whose file name carries the sandbox path.
func multipartBody(t *testing.T, files [][2]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, f[0]))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f[1])
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func gzipped(t *testing.T, b []byte) *bytes.Buffer {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

type written struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

func TestFilesUploadDownload(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	big := make([]byte, 3<<20+17)
	rand.Read(big)

	uploads := []struct {
		name   string
		query  string
		hdr    map[string]string
		body   func() (string, io.Reader)
		status int
		want   []written // or the error message
		errMsg string
	}{
		{"multipart with paths in file names", "", nil, func() (string, io.Reader) {
			return multipartBody(t, [][2]string{{"/home/user/up/a.txt", "alpha"}, {"up/nested/b.txt", "beta"}})
		}, 200, []written{{"/home/user/up/a.txt", "a.txt", "file"}, {"/home/user/up/nested/b.txt", "b.txt", "file"}}, ""},
		{"multipart to the path query", "?path=/tmp/q.txt", nil, func() (string, io.Reader) {
			return multipartBody(t, [][2]string{{"ignored.txt", "queried"}})
		}, 200, []written{{"/tmp/q.txt", "q.txt", "file"}}, ""},
		{"multipart twice to one path", "", nil, func() (string, io.Reader) {
			return multipartBody(t, [][2]string{{"/tmp/dup", "1"}, {"/tmp/dup", "2"}})
		}, 400, nil, "you cannot upload multiple files to the same path '/tmp/dup' in one upload request, only the first specified file was uploaded"},
		{"octet-stream", "?path=raw.bin", nil, func() (string, io.Reader) {
			return "application/octet-stream", bytes.NewReader(big)
		}, 200, []written{{"/home/user/raw.bin", "raw.bin", "file"}}, ""},
		{"gzip octet-stream", "?path=/tmp/gz.txt&username=root", map[string]string{"Content-Encoding": "gzip"}, func() (string, io.Reader) {
			return "application/octet-stream", gzipped(t, []byte("unzipped"))
		}, 200, []written{{"/tmp/gz.txt", "gz.txt", "file"}}, ""},
		{"corrupt gzip", "?path=/tmp/corrupt", map[string]string{"Content-Encoding": "gzip"}, func() (string, io.Reader) {
			b := gzipped(t, bytes.Repeat([]byte("x"), 1<<20)).Bytes()
			b[len(b)/2] ^= 0xff
			return "application/octet-stream", bytes.NewReader(b)
		}, 400, nil, ""},
		{"empty file", "?path=/tmp/empty", nil, func() (string, io.Reader) {
			return "application/octet-stream", strings.NewReader("")
		}, 200, []written{{"/tmp/empty", "empty", "file"}}, ""},
		{"octet-stream without path", "", nil, func() (string, io.Reader) {
			return "application/octet-stream", strings.NewReader("x")
		}, 400, nil, "path query parameter is required for raw body upload"},
		{"other content type", "?path=/tmp/x", nil, func() (string, io.Reader) {
			return "text/plain", strings.NewReader("x")
		}, 400, nil, "unsupported content type: text/plain, expected multipart/form-data or application/octet-stream"},
		{"not permitted", "?path=/etc/nope", nil, func() (string, io.Reader) {
			return "application/octet-stream", strings.NewReader("x")
		}, 403, nil, ""},
	}
	for _, tt := range uploads {
		t.Run("upload "+tt.name, func(t *testing.T) {
			ctype, body := tt.body()
			hdr := map[string]string{"Content-Type": ctype, "X-Access-Token": e.token}
			for k, v := range tt.hdr {
				hdr[k] = v
			}
			res, b := e.do(t, "POST", "/files"+tt.query, hdr, body)
			if res.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, b, tt.status)
			}
			if tt.status != 200 {
				var got struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(b, &got); err != nil || got.Code != tt.status || (tt.errMsg != "" && got.Message != tt.errMsg) {
					t.Errorf("error body %s, want message %q", b, tt.errMsg)
				}
				return
			}
			var got []written
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("answer %v, want %v", got, tt.want)
			}
		})
	}

	downloads := []struct {
		name     string
		query    string
		gzip     bool
		status   int
		want     []byte
		wantBody string
	}{
		{"identity", "?path=/home/user/up/a.txt", false, 200, []byte("alpha"), ""},
		{"through a symlink", "?path=alink", false, 200, []byte("alpha"), ""},
		{"broken symlink", "?path=blink", false, 404, nil, `{"code":404,"message":"path 'blink' does not exist"}`},
		{"gzip", "?path=up/nested/b.txt", true, 200, []byte("beta"), ""},
		{"large", "?path=raw.bin", true, 200, big, ""},
		{"large identity", "?path=~/raw.bin", false, 200, big, ""},
		{"root's file as root", "?path=/tmp/gz.txt&username=root", false, 200, []byte("unzipped"), ""},
		{"empty", "?path=/tmp/empty", false, 200, []byte{}, ""},
		{"missing", "?path=nope.txt", true, 404, nil, `{"code":404,"message":"path 'nope.txt' does not exist"}`},
		{"directory", "?path=/home/user/up", false, 400, nil, `{"code":400,"message":"path '/home/user/up' is a directory"}`},
	}
	e.sh(t, "", "ln -s up/a.txt ~/alink && ln -s /nowhere ~/blink")
	t.Run("HEAD", func(t *testing.T) {
		res, b := e.do(t, "HEAD", "/files?path=raw.bin", map[string]string{"X-Access-Token": e.token}, nil)
		if res.StatusCode != 200 || len(b) != 0 || res.Header.Get("Content-Disposition") != "inline; filename=raw.bin" ||
			res.Header.Get("Content-Security-Policy") != "sandbox" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("HEAD: %d, %d bytes, %v", res.StatusCode, len(b), res.Header)
		}
	})
	for _, tt := range downloads {
		t.Run("download "+tt.name, func(t *testing.T) {
			hdr := map[string]string{"X-Access-Token": e.token, "Accept-Encoding": "identity"}
			if tt.gzip {
				hdr["Accept-Encoding"] = "gzip, deflate"
			}
			res, b := e.do(t, "GET", "/files"+tt.query, hdr, nil)
			if res.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, b, tt.status)
			}
			if tt.status != 200 {
				if strings.TrimSpace(string(b)) != tt.wantBody {
					t.Errorf("body %s, want %s", b, tt.wantBody)
				}
				return
			}
			if got := res.Header.Get("Content-Encoding"); (got == "gzip") != tt.gzip {
				t.Fatalf("Content-Encoding %q", got)
			}
			if tt.gzip {
				zr, err := gzip.NewReader(bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				if b, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			} else if res.Header.Get("Content-Length") != "" && res.Header.Get("Content-Length") != strconv.Itoa(len(tt.want)) {
				t.Errorf("Content-Length %s", res.Header.Get("Content-Length"))
			}
			if len(tt.want) == 0 && res.Header.Get("Content-Length") != "0" {
				t.Errorf("empty file: Content-Length %q, want 0", res.Header.Get("Content-Length"))
			}
			if !bytes.Equal(b, tt.want) {
				t.Errorf("got %d bytes, want %d", len(b), len(tt.want))
			}
		})
	}
}

func TestFilesMetadata(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	fs := e.filesystem("", nil)
	steps := []struct {
		name   string
		hdr    map[string]string
		status int
		want   map[string]string
	}{
		{"set", map[string]string{"X-Metadata-Owner": "alice", "x-metadata-Build-Id": "42"}, 200, map[string]string{"owner": "alice", "build-id": "42"}},
		{"replace", map[string]string{"X-Metadata-Stage": "two"}, 200, map[string]string{"stage": "two"}},
		{"not printable", map[string]string{"X-Metadata-Bad": "caf\xc3\xa9"}, 400, map[string]string{"stage": "two"}},
		{"too large", map[string]string{"X-Metadata-Big": strings.Repeat("x", 5000)}, 400, map[string]string{"stage": "two"}},
		{"clear", nil, 200, nil},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			hdr := map[string]string{"X-Access-Token": e.token, "Content-Type": "application/octet-stream"}
			for k, v := range st.hdr {
				hdr[k] = v
			}
			res, b := e.do(t, "POST", "/files?path=meta.txt", hdr, strings.NewReader(st.name))
			if res.StatusCode != st.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, b, st.status)
			}
			if st.status == 200 {
				var got []struct {
					Metadata map[string]string `json:"metadata"`
				}
				if err := json.Unmarshal(b, &got); err != nil || len(got) != 1 || !maps.Equal(got[0].Metadata, st.want) {
					t.Errorf("answer %s, want metadata %v", b, st.want)
				}
			}
			res2, err := fs.Stat(ctxTimeout(t, time.Minute), connect.NewRequest(&filesystem.StatRequest{Path: "meta.txt"}))
			if err != nil {
				t.Fatal(err)
			}
			if got := res2.Msg.GetEntry().GetMetadata(); !maps.Equal(got, st.want) {
				t.Errorf("Stat metadata %v, want %v", got, st.want)
			}
			list, err := fs.ListDir(ctxTimeout(t, time.Minute), connect.NewRequest(&filesystem.ListDirRequest{Path: "~"}))
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range list.Msg.GetEntries() {
				if en.GetName() == "meta.txt" && !maps.Equal(en.GetMetadata(), st.want) {
					t.Errorf("ListDir metadata %v, want %v", en.GetMetadata(), st.want)
				}
			}
		})
	}
	// A rename answers the entry with the metadata the file keeps.
	hdr := map[string]string{"X-Access-Token": e.token, "Content-Type": "application/octet-stream", "X-Metadata-Kept": "yes"}
	if res, b := e.do(t, "POST", "/files?path=meta.txt", hdr, strings.NewReader("m")); res.StatusCode != 200 {
		t.Fatalf("write: status %d (%s)", res.StatusCode, b)
	}
	mv, err := fs.Move(ctxTimeout(t, time.Minute), connect.NewRequest(&filesystem.MoveRequest{Source: "meta.txt", Destination: "moved/meta.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mv.Msg.GetEntry(), map[string]string{"kept": "yes"}; got.GetPath() != "/home/user/moved/meta.txt" || !maps.Equal(got.GetMetadata(), want) {
		t.Errorf("Move answered %v, want /home/user/moved/meta.txt with metadata %v", got, want)
	}
}

// sign makes the query of a signed /files URL, as sandbox.downloadUrl()
// and uploadUrl() do.
func sign(path, op, user, token string, expires int64) string {
	q := url.Values{"path": {path}}
	exp := ""
	if expires != 0 {
		exp = strconv.FormatInt(expires, 10)
		q.Set("signature_expiration", exp)
	}
	if user != "" {
		q.Set("username", user)
	}
	q.Set("signature", envd.Signature(path, op, user, token, exp))
	return "/files?" + q.Encode()
}

func TestSignedURLs(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	future, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	tests := []struct {
		name    string
		method  string
		target  string
		status  int
		message string
	}{
		{"write", "POST", sign("signed.txt", "write", "", e.token, 0), 200, ""},
		{"read", "GET", sign("signed.txt", "read", "", e.token, 0), 200, ""},
		{"read as a user, expiring", "GET", sign("signed.txt", "read", "user", e.token, future), 200, ""},
		{"expired", "GET", sign("signed.txt", "read", "", e.token, past), 401, "signature is already expired"},
		{"another token", "GET", sign("signed.txt", "read", "", "other", 0), 401, "invalid signature"},
		{"read signature used to write", "POST", sign("signed.txt", "read", "", e.token, 0), 401, "invalid signature"},
		{"another path", "GET", strings.Replace(sign("signed.txt", "read", "", e.token, 0), "path=signed.txt", "path=%2Fetc%2Fpasswd", 1), 401, "invalid signature"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			hdr := map[string]string{}
			if tt.method == "POST" {
				body = strings.NewReader("signed content")
				hdr["Content-Type"] = "application/octet-stream"
			}
			res, b := e.do(t, tt.method, tt.target, hdr, body)
			if res.StatusCode != tt.status {
				t.Fatalf("status %d (%s), want %d", res.StatusCode, b, tt.status)
			}
			if tt.message != "" && strings.TrimSpace(string(b)) != fmt.Sprintf(`{"code":401,"message":%q}`, tt.message) {
				t.Errorf("body %s, want message %q", b, tt.message)
			}
			if tt.method == "GET" && tt.status == 200 && string(b) != "signed content" {
				t.Errorf("read %q", b)
			}
			// What the router asks to find the sandbox of a header-less URL.
			req, _ := http.NewRequest(tt.method, e.url+tt.target, nil)
			if got := envd.Signed(req, e.token); got != (tt.status == 200) {
				t.Errorf("Signed = %v", got)
			}
		})
	}
}

package agent

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// The agent answers E2B's code-interpreter health check where configured,
// as E2B's server does: 200 and the JSON string "OK".
func TestCodeHealth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	newHarness(t, func(c *Config) { c.CodeHealth = addr })
	client := &http.Client{Timeout: 10 * time.Second}
	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err = client.Get("http://" + addr + "/health"); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != `"OK"` || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /health: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp, err = client.Get("http://" + addr + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /nope: %d", resp.StatusCode)
	}
}

// KILN_CODE_HEALTH sets or turns off the health check's address; an agent
// that is not PID 1 (this test) serves none by default.
func TestCodeHealthConfig(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, ""},
		{[]string{"KILN_CODE_HEALTH=127.0.0.1:49999"}, "127.0.0.1:49999"},
		{[]string{"KILN_CODE_HEALTH=off"}, ""},
	} {
		c, err := ConfigFromEnv(tc.env)
		if err != nil || c.CodeHealth != tc.want {
			t.Errorf("%q: CodeHealth %q, %v; want %q", tc.env, c.CodeHealth, err, tc.want)
		}
	}
}

package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// The control plane's JSON, field for field as E2B's SDKs read and write
// it (e2b-protocol.md §2.3).

// newSandbox is the body of POST /sandboxes (v1, with Secure) and POST
// /v2/sandboxes. Fields Kiln does not act on are accepted and ignored.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"` // false: autoPause keeps only the files
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []volumeMount `json:"volumeMounts"`
}

// sandboxJSON is E2B's Sandbox: the answer to create and connect.
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	StartedAt   stamp             `json:"startedAt"`
	EndAt       stamp             `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	State       string            `json:"state"`
	Metadata    map[string]string `json:"metadata"`
}

// sandboxDetail is E2B's SandboxDetail (GET /sandboxes/{id}).
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken string        `json:"envdAccessToken,omitempty"`
	Domain          *string       `json:"domain"`
	Lifecycle       lifecycle     `json:"lifecycle"`
	VolumeMounts    []volumeMount `json:"volumeMounts"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"` // kill | pause
}

// connectRequest is the body of POST /sandboxes/{id}/connect (v1 and v2)
// and of the deprecated POST /sandboxes/{id}/resume; memory false (the
// SDK's onResume: "reboot") boots a paused sandbox afresh on its files.
type connectRequest struct {
	Timeout   *int64 `json:"timeout"`
	Memory    *bool  `json:"memory"`
	AutoPause *bool  `json:"autoPause"`
}

// pauseRequest is the body of POST /sandboxes/{id}/pause; memory false
// (the SDK's keepMemory: false) keeps only the files.
type pauseRequest struct {
	Memory *bool `json:"memory"`
}

type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

type refreshRequest struct {
	Duration *int64 `json:"duration"`
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     stamp   `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// stamp is a time as E2B's responses carry it: RFC 3339 in UTC with
// microseconds, always six digits (E2B's API answers the microseconds its
// database keeps; Kiln's store keeps the same), the precision of every
// time the E2B API answers, including the code interpreter's output
// timestamps (timestampLayout).
type stamp time.Time

// stampOf is t at E2B's precision: truncated, never rounded up, so that
// a time read back from a response and sent as a filter (startedAfter)
// is never later than the time it came from.
func stampOf(t time.Time) stamp { return stamp(t.UTC().Truncate(time.Microsecond)) }

func (s stamp) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(s).UTC().Truncate(time.Microsecond).Format(timestampLayout) + `"`), nil
}

// errorBody is E2B's Error: the SDKs read the integer code in the body.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// notFoundBody is the data plane's answer for a sandbox that is not
// running.
type notFoundBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
}

// portClosedBody is the data plane's answer for a port nobody serves.
type portClosedBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port"`
}

// writeJSON encodes v as the response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeStatus answers with E2B's error JSON.
func writeStatus(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, errorBody{Code: status, Message: message})
}

// writeError answers err as E2B's error JSON, with the server's status
// and message for it.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := h.problem(r, err)
	writeStatus(w, status, msg)
}

// maxJSONBytes bounds control-plane request bodies.
const maxJSONBytes = 1 << 20

// decodeJSON decodes the request's JSON body into v; an empty body leaves
// v as it is (several E2B bodies are optional). Unknown fields are
// ignored: the SDKs send fields Kiln does not act on.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBytes)).Decode(v)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return nil
	case errors.As(err, new(*http.MaxBytesError)):
		return fmt.Errorf("request body larger than %d bytes: %w", maxJSONBytes, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("malformed JSON body: %v: %w", err, errdefs.ErrInvalidArgument)
}

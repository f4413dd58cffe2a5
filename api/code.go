package api

import "time"

// Result is one rich output of an execution, as a Jupyter MIME bundle:
// keys are MIME types ("text/plain", "text/html", "text/markdown",
// "image/png", "image/jpeg", "image/svg+xml", "application/json",
// "text/latex", "application/pdf"); binary formats are base64 strings, as
// in Jupyter.
type Result struct {
	Data map[string]string `json:"data"`
	// IsMainResult marks the cell's last value (Jupyter execute_result),
	// as opposed to display() calls and figures (display_data).
	IsMainResult bool `json:"is_main_result,omitempty"`
}

// ExecutionError is an exception raised by executed code.
type ExecutionError struct {
	Name      string `json:"name"`      // e.g. "ZeroDivisionError"
	Value     string `json:"value"`     // e.g. "division by zero"
	Traceback string `json:"traceback"` // the formatted traceback, ANSI colours removed
}

// Context is a persistent interpreter inside a sandbox: variables,
// imports and definitions survive from one execution to the next.
type Context struct {
	ID        string    `json:"id"`
	Language  string    `json:"language"`
	Cwd       string    `json:"cwd"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateContextRequest is the body of POST /v1/sandboxes/{id}/contexts.
type CreateContextRequest struct {
	Language string            `json:"language,omitempty"` // default "python"
	Cwd      string            `json:"cwd,omitempty"`      // default the user's home
	Env      map[string]string `json:"env,omitempty"`
}

// CodeRequest is the body of POST /v1/sandboxes/{id}/code. Without a
// ContextID the code runs in the language's default context.
type CodeRequest struct {
	Code      string            `json:"code"`
	Language  string            `json:"language,omitempty"` // default "python"; ignored with ContextID
	ContextID string            `json:"context_id,omitempty"`
	Env       map[string]string `json:"env,omitempty"`     // for this execution only
	Timeout   float64           `json:"timeout,omitempty"` // seconds; interrupts, the context survives
}

// CodeResult is the aggregated answer to POST /v1/sandboxes/{id}/code
// with Accept: application/json.
type CodeResult struct {
	Stdout         string          `json:"stdout"`
	Stderr         string          `json:"stderr"`
	Results        []Result        `json:"results"`
	Error          *ExecutionError `json:"error,omitempty"`
	ExecutionCount int             `json:"execution_count,omitempty"`
}

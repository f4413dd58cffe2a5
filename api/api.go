// Package api is Kiln's wire contract: the types that cross the HTTP API and
// the host–agent channel. It imports only the standard library so that the
// SDK, the server and the in-sandbox agent can all share it.
package api

import "time"

// ErrorCode is the closed set of error classes a client can see.
type ErrorCode string

const (
	CodeInvalidArgument    ErrorCode = "invalid_argument"
	CodeNotFound           ErrorCode = "not_found"
	CodeAlreadyExists      ErrorCode = "already_exists"
	CodeFailedPrecondition ErrorCode = "failed_precondition"
	CodeResourceExhausted  ErrorCode = "resource_exhausted"
	CodeUnauthenticated    ErrorCode = "unauthenticated"
	CodePermissionDenied   ErrorCode = "permission_denied"
	CodeUnavailable        ErrorCode = "unavailable"
	CodeDeadlineExceeded   ErrorCode = "deadline_exceeded"
	CodeInternal           ErrorCode = "internal"
)

// Error is the body of every error response.
type Error struct {
	Code      ErrorCode `json:"code"`
	Message   string    `json:"message"`
	RequestID string    `json:"request_id,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// EventType names what an Event carries.
type EventType string

const (
	EventStart  EventType = "start"  // a process started: PID
	EventStdout EventType = "stdout" // Data
	EventStderr EventType = "stderr" // Data
	EventExit   EventType = "exit"   // Exit
	EventError  EventType = "error"  // Error: the stream ended abnormally
	EventFile   EventType = "file"   // File: a watched directory changed
	EventPing   EventType = "ping"   // keepalive, carries nothing

	// Code execution (kernels) adds:
	EventResult         EventType = "result"          // Result: a rich output (display() or the cell's value)
	EventExecutionError EventType = "execution_error" // ExecutionError: the code raised
	EventDone           EventType = "done"            // ExecutionCount: the execution finished
)

// Event is one item of any stream: process output, file watch, and later
// kernel results. Seq numbers the events of one stream from 1 so that a
// client can resume after a reconnect.
type Event struct {
	Seq   uint64      `json:"seq"`
	Type  EventType   `json:"type"`
	Time  time.Time   `json:"time,omitzero"`
	PID   int         `json:"pid,omitempty"`
	Data  []byte      `json:"data,omitempty"`
	Exit  *ExitStatus `json:"exit,omitempty"`
	File  *FileEvent  `json:"file,omitempty"`
	Error *Error      `json:"error,omitempty"`

	Result         *Result         `json:"result,omitempty"`
	ExecutionError *ExecutionError `json:"execution_error,omitempty"`
	ExecutionCount int             `json:"execution_count,omitempty"`
}

// ExitReason says why a process ended, beyond its exit code.
type ExitReason string

const (
	ExitNormal      ExitReason = ""              // the process exited on its own
	ExitSignaled    ExitReason = "signaled"      // killed by a signal someone sent
	ExitTimeout     ExitReason = "timeout"       // killed with its children when its timeout passed
	ExitOOM         ExitReason = "out_of_memory" // killed because the sandbox ran out of memory
	ExitOutputLimit ExitReason = "output_limit"  // output beyond the cap was dropped (process ran on)
	ExitPidsLimit   ExitReason = "pids_limit"    // killed because the sandbox had too many tasks
)

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code      int        `json:"code"`             // exit code, or 128+signal when signaled
	Signal    string     `json:"signal,omitempty"` // e.g. "SIGKILL"
	Reason    ExitReason `json:"reason,omitempty"`
	Truncated bool       `json:"truncated,omitempty"` // output exceeded the cap and was cut
	Message   string     `json:"message,omitempty"`   // human-readable reason
}

// ProcessInfo describes a process started through the API.
type ProcessInfo struct {
	PID       int               `json:"pid"`
	Tag       string            `json:"tag,omitempty"`
	Args      []string          `json:"args"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	PTY       bool              `json:"pty,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	StartedAt time.Time         `json:"started_at"`
	Exit      *ExitStatus       `json:"exit,omitempty"` // set once it ended
}

// FileType is the kind of a file system entry.
type FileType string

const (
	FileRegular FileType = "file"
	FileDir     FileType = "dir"
	FileSymlink FileType = "symlink"
	FileOther   FileType = "other"
)

// FileInfo describes a file system entry inside a sandbox.
type FileInfo struct {
	Name          string    `json:"name"`
	Path          string    `json:"path"`
	Type          FileType  `json:"type"`
	Size          int64     `json:"size"`
	Mode          uint32    `json:"mode"` // permission bits
	Owner         string    `json:"owner,omitempty"`
	Group         string    `json:"group,omitempty"`
	ModTime       time.Time `json:"mod_time"`
	SymlinkTarget string    `json:"symlink_target,omitempty"`
	// Xattrs are extended attributes, when asked for by prefix, keyed by
	// their names without it.
	Xattrs map[string]string `json:"xattrs,omitempty"`
	// Target is, for a symlink when asked, what it finally points to (at
	// its resolved absolute path); absent if the link is broken.
	Target *FileInfo `json:"target,omitempty"`
}

// FileOp is what happened to a watched path.
type FileOp string

const (
	FileCreate FileOp = "create"
	FileWrite  FileOp = "write"
	FileRemove FileOp = "remove"
	FileRename FileOp = "rename"
	FileChmod  FileOp = "chmod"
)

// FileEvent is one change under a watched directory.
type FileEvent struct {
	Op   FileOp `json:"op"`
	Path string `json:"path"`
}

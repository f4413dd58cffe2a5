package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// Options configure a Session.
type Options struct {
	// Template of the session's sandbox (default DefaultTemplate).
	Template string
	// Timeout is how long the sandbox lives after the session's last call
	// (default DefaultTimeout): every call pushes its end back.
	Timeout time.Duration
	// Sandbox, if set, is an existing sandbox the session uses instead of
	// making its own; it is not killed when the session ends.
	Sandbox string
	Log     *slog.Logger
}

const (
	// DefaultTemplate has the interpreters run_code needs.
	DefaultTemplate = "code-interpreter"
	// DefaultTimeout is a session sandbox's life after the last call.
	DefaultTimeout = 15 * time.Minute
	// refreshEvery spaces out the timeout extensions of a busy session.
	refreshEvery = time.Minute
	// killTimeout bounds killing a session's sandbox when it ends.
	killTimeout = 30 * time.Second
)

// Session is one model session's use of Kiln (an MCP session): it makes
// its sandbox on first use, reuses it so that interpreter state and files
// persist from call to call, and kills it on Close. It is safe for
// concurrent calls.
type Session struct {
	c    *client.Client
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	id        string // the current sandbox; "" before first use
	owned     bool   // made by the session, so killed by Close
	refreshed time.Time
	closed    bool

	onAttach func() bool // set by HTTPHandler; false ends the session
	onClose  func()      // set by HTTPHandler
	conn     io.Closer   // the MCP session, once known
}

// NewSession returns a session that calls Kiln through c.
func NewSession(c *client.Client, o Options) *Session {
	if o.Template == "" {
		o.Template = DefaultTemplate
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Session{c: c, opts: o, log: o.Log, id: o.Sandbox, refreshed: time.Now()}
}

var errClosed = errors.New("the session has ended")

// Call runs the tool name with the model's JSON arguments. Like [Call],
// failures are results with IsError set; the error is for an unknown tool.
func (s *Session) Call(ctx context.Context, name string, args json.RawMessage, progress Progress) (*api.ToolResult, error) {
	switch name {
	case "create_sandbox":
		var a struct {
			Template string `json:"template"`
		}
		if res := decode(args, &a); res != nil {
			return res, nil
		}
		return s.recreate(ctx, a.Template), nil
	case "kill_sandbox":
		if res := decode(args, &struct{}{}); res != nil {
			return res, nil
		}
		return s.kill(ctx), nil
	}
	if _, ok := Lookup(name); !ok {
		return nil, unknownTool(name)
	}
	id, res := s.sandbox(ctx)
	if res != nil {
		return res, nil
	}
	res, err := Call(ctx, s.c, id, name, args, progress)
	if err != nil || !res.IsError {
		return res, err
	}
	if s.gone(ctx, id) {
		res.Content = append(res.Content, api.ToolContent{Type: "text", Text: "The session's sandbox " + id +
			" is gone (it expired or was killed): its state is lost. The next call starts a new sandbox."})
	}
	return res, nil
}

// sandbox returns the session's sandbox, making it on first use and
// pushing its end back on later ones.
func (s *Session) sandbox(ctx context.Context) (string, *api.ToolResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return "", failed(errClosed.Error())
	case s.id == "":
		if res := s.create(ctx, s.opts.Template); res != nil {
			return "", res
		}
	case time.Since(s.refreshed) > refreshEvery:
		if _, err := s.c.SetTimeout(ctx, s.id, s.opts.Timeout); err != nil && s.owned && ended(ctx, s.c, s.id) {
			// Say so rather than silently starting over without the
			// state the model expects.
			s.log.Info("session sandbox lost", "sandbox_id", s.id, "err", err)
			s.id, s.owned = "", false
			return "", failed("the session's sandbox is gone (it expired or was killed): its state is lost. " +
				"Call the tool again to start a new sandbox. (" + failure(err).Content[0].Text + ")")
		}
		s.refreshed = time.Now()
	}
	return s.id, nil
}

// create makes a sandbox of template for the session; s.mu is held.
func (s *Session) create(ctx context.Context, template string) *api.ToolResult {
	sb, err := s.c.CreateSandbox(ctx, api.CreateSandboxRequest{
		Template: template, Timeout: int64(s.opts.Timeout.Seconds()),
		Metadata: map[string]string{"created_by": "kiln-mcp"},
	})
	if err != nil {
		res := failure(err)
		res.Content[0].Text = "starting the session's sandbox: " + res.Content[0].Text
		return res
	}
	s.id, s.owned, s.refreshed = sb.ID, true, time.Now()
	s.log.Info("session sandbox created", "sandbox_id", sb.ID, "template", template)
	return nil
}

// recreate gives the session a fresh sandbox; the old one is killed once
// the new one runs (one given in Options.Sandbox is left running).
func (s *Session) recreate(ctx context.Context, template string) *api.ToolResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return failed(errClosed.Error())
	}
	if template == "" {
		template = s.opts.Template
	}
	old, owned := s.id, s.owned
	if res := s.create(ctx, template); res != nil {
		return res
	}
	msg := fmt.Sprintf("Started sandbox %s (template %s).", s.id, template)
	switch {
	case old != "" && owned:
		s.killSandbox(ctx, old)
		msg += " The previous sandbox was killed: its state is gone."
	case old != "":
		msg += " The previous sandbox " + old + " keeps running outside this session."
	}
	return text(msg)
}

func (s *Session) kill(ctx context.Context) *api.ToolResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, owned := s.id, s.owned
	switch {
	case id == "":
		return text("The session has no sandbox; the next call starts one.")
	case !owned:
		s.id = ""
		return text("Left sandbox " + id + ", which was given to this session: it keeps running. The next call starts a new one.")
	}
	if err := s.killLocked(ctx); err != nil {
		return failure(err)
	}
	return text("Killed sandbox " + id + "; the next call starts a new one.")
}

// killLocked kills the session's own sandbox and forgets it (one given
// in Options.Sandbox is only forgotten); s.mu is held.
func (s *Session) killLocked(ctx context.Context) error {
	id, owned := s.id, s.owned
	s.id, s.owned = "", false
	if id == "" || !owned {
		return nil
	}
	return s.killSandbox(ctx, id)
}

// killSandbox kills sandbox id; one already gone is not an error.
func (s *Session) killSandbox(ctx context.Context, id string) error {
	err := s.c.KillSandbox(ctx, id)
	if client.IsCode(err, api.CodeNotFound) {
		err = nil
	}
	s.log.Info("session sandbox killed", "sandbox_id", id, "err", err)
	return err
}

// gone reports whether the sandbox id no longer runs, and forgets it if
// so; it is asked after a failed call, which may be the first sign.
func (s *Session) gone(ctx context.Context, id string) bool {
	if !ended(ctx, s.c, id) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id == id {
		s.id, s.owned = "", false
	}
	return true
}

// ended reports whether sandbox id is known to be gone for good: not
// found, or neither running nor paused. Not knowing is not ended.
func ended(ctx context.Context, c *client.Client, id string) bool {
	sb, err := c.GetSandbox(ctx, id)
	if err != nil {
		return client.IsCode(err, api.CodeNotFound)
	}
	return sb.State != "running" && sb.State != "paused" && sb.State != "creating"
}

// Close ends the session and kills its sandbox (unless it was given in
// Options.Sandbox). Later calls fail. It is idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.onClose != nil {
		s.onClose()
	}
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	return s.killLocked(ctx)
}

// end kills the session's sandbox, which ends the calls in flight, then
// closes its MCP connection (which waits for them) and so its streams.
func (s *Session) end() {
	s.Close()
	s.mu.Lock()
	conn := s.conn
	s.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// attach records the MCP connection of the session and closes the
// session when it ends.
func (s *Session) attach(conn interface {
	io.Closer
	Wait() error
}) {
	s.mu.Lock()
	if s.conn != nil {
		s.mu.Unlock()
		return
	}
	s.conn = conn
	s.mu.Unlock()
	if s.onAttach != nil && !s.onAttach() {
		go conn.Close() // not here: Close waits for the calls in flight, maybe ours
	}
	go func() { conn.Wait(); s.Close() }()
}

// SandboxID returns the session's current sandbox, "" if it has none.
func (s *Session) SandboxID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

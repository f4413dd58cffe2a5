package repl

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/kernel"
)

// nodeDriver is the script node runs: it reads cells from fd 3 and runs
// them in one persistent vm context.
//
//go:embed node_driver.js
var nodeDriver []byte

// NewNode starts a persistent JavaScript REPL on node. See NewTypeScript.
func NewNode(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
	return newNode(ctx, o, "javascript")
}

// NewTypeScript starts a persistent REPL on node that runs TypeScript:
// cells go through the typescript package's transpileModule when one is
// installed (locally in the cwd or globally), else through node's own
// type stripping (node 22.13+), else they run as JavaScript, so plain
// JavaScript always works and type annotations need one of the two.
func NewTypeScript(ctx context.Context, o kernel.Options) (kernel.Kernel, error) {
	return newNode(ctx, o, "typescript")
}

func newNode(ctx context.Context, o kernel.Options, lang string) (kernel.Kernel, error) {
	k := &replKernel{lang: lang, opts: o}
	k.start = k.startNode
	k.request = nodeRequest
	k.result = nodeResult
	k.needResp = true
	k.interrupt = nodeInterrupt
	if err := k.Restart(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// startNode runs the driver from stdin; it learns its marker token and
// language from its environment.
func (k *replKernel) startNode() (*session, error) {
	token := newToken()
	return startSession(k.opts, spec{
		argv:   []string{"node", "--stack-trace-limit=30", "-"},
		stdin:  nodeDriver,
		reqFD:  3,
		ctlFD:  4,
		token:  token,
		extEnv: []string{"KILN_REPL_TOKEN=" + token, "KILN_REPL_LANG=" + k.lang},
	})
}

func nodeRequest(_ *session, id int, code string, env map[string]string) ([]byte, error) {
	b, err := json.Marshal(struct {
		ID   int               `json:"id"`
		Code string            `json:"code"`
		Env  map[string]string `json:"env,omitempty"`
	}{id, code, env})
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	return append(b, '\n'), nil
}

// nodeResult turns the driver's answer into events.
func nodeResult(r turnResult) []api.Event {
	var resp struct {
		Data  map[string]string   `json:"data"`
		Error *api.ExecutionError `json:"error"`
	}
	if err := json.Unmarshal(r.resp, &resp); err != nil {
		return nil
	}
	var evs []api.Event
	if resp.Data != nil {
		evs = append(evs, api.Event{Type: api.EventResult, Result: &api.Result{Data: resp.Data, IsMainResult: true}})
	}
	if resp.Error != nil {
		evs = append(evs, api.Event{Type: api.EventExecutionError, ExecutionError: resp.Error})
	}
	return evs
}

// nodeInterrupt: SIGINT to node (the driver breaks a running script or
// abandons an awaited promise), then to the whole group (for a blocking
// child such as execSync), then kill (a synchronous loop after an await
// cannot be broken; the context is lost).
func nodeInterrupt(s *session, step int, _ []byte) {
	switch step {
	case 0:
		s.signal(syscall.SIGINT, false)
	case 1:
		s.signal(syscall.SIGINT, true)
	default:
		s.signal(syscall.SIGKILL, true)
	}
}

// exitCode parses the "exit N" line the node driver writes before it exits.
func exitCode(extra []string) (int, bool) {
	for _, e := range extra {
		if v, ok := strings.CutPrefix(e, "exit "); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n, true
			}
		}
		if v, ok := strings.CutPrefix(e, "exit:"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n, true
			}
		}
	}
	return 0, false
}

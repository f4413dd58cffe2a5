// Command strawberry runs the classic "how many r's are in strawberry?"
// through a real function-calling loop against a real Kiln server. By
// default a scripted stand-in plays the model, so it needs no network and
// no model API key; with -model it asks a real model through OpenAI's Chat
// Completions API (or any server speaking it, at OPENAI_BASE_URL), with
// the same messages and tools: see docs/llm.md.
//
//	export KILN_URL=http://127.0.0.1:8420 KILN_API_KEY=e2b_...
//	go run ./examples/strawberry
//	OPENAI_API_KEY=sk-... go run ./examples/strawberry -model gpt-4.1-mini
//
// The loop: the model gets the question and Kiln's tool definitions (GET
// /v1/tools?format=openai); it answers with a tool call (execute_python);
// the program passes the call's name and arguments to Kiln (POST
// /v1/sandboxes/{id}/tools/{name}) and the result back to the model as a
// "tool" message; the model answers from the result.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// The OpenAI Chat Completions wire types the loop needs.
type (
	chatResponse struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	chatRequest struct {
		Model    string          `json:"model"`
		Messages []message       `json:"messages"`
		Tools    json.RawMessage `json:"tools,omitempty"`
	}
	message struct {
		Role       string     `json:"role"` // system, user, assistant, tool
		Content    string     `json:"content,omitempty"`
		ToolCalls  []toolCall `json:"tool_calls,omitempty"`
		ToolCallID string     `json:"tool_call_id,omitempty"`
	}
	toolCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"` // "function"
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"` // a JSON object, as a string
		} `json:"function"`
	}
)

// model is what the loop needs of a model: the next assistant message.
type model func(ctx context.Context, req chatRequest) (message, error)

const question = "How many times does the letter r appear in the word strawberry?"

func main() {
	name := flag.String("model", "", "ask this OpenAI `model` (OPENAI_API_KEY, OPENAI_BASE_URL) instead of the scripted one")
	flag.Parse()
	ask := scriptedModel
	if *name != "" {
		base := os.Getenv("OPENAI_BASE_URL")
		if base == "" {
			base = "https://api.openai.com/v1"
		}
		ask = openAIModel(base, os.Getenv("OPENAI_API_KEY"), *name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	answer, err := run(ctx, client.FromEnv(), ask, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "strawberry:", err)
		os.Exit(1)
	}
	fmt.Println("answer:", answer)
}

// run asks the model the question, running its tool calls in a fresh
// Kiln sandbox, and returns the model's final answer. It prints every
// message to log as it goes.
func run(ctx context.Context, c *client.Client, ask model, log io.Writer) (string, error) {
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "code-interpreter", Timeout: 300})
	if err != nil {
		return "", err
	}
	defer c.KillSandbox(context.WithoutCancel(ctx), sb.ID)
	tools, err := c.Tools(ctx, "openai", "execute_python")
	if err != nil {
		return "", err
	}
	req := chatRequest{Tools: tools, Messages: []message{{Role: "user", Content: question}}}
	show(log, "user → model", req.Messages[0])
	for range 5 { // turns
		reply, err := ask(ctx, req)
		if err != nil {
			return "", err
		}
		show(log, "model → program", reply)
		req.Messages = append(req.Messages, reply)
		if len(reply.ToolCalls) == 0 {
			return reply.Content, nil
		}
		for _, call := range reply.ToolCalls {
			res, err := c.CallTool(ctx, sb.ID, call.Function.Name, json.RawMessage(call.Function.Arguments))
			if err != nil {
				return "", err // the sandbox is unusable: not something the model can fix
			}
			show(log, "kiln → program", res)
			msg := message{Role: "tool", ToolCallID: call.ID, Content: toolText(res)}
			show(log, "program → model", msg)
			req.Messages = append(req.Messages, msg)
		}
	}
	return "", errors.New("the model did not answer within 5 turns")
}

// toolText is a tool result as the text of a "tool" message. OpenAI's
// tool messages carry text only; an image (a chart) would go to the model
// in a following user message as an image_url data URL (docs/llm.md).
func toolText(res *api.ToolResult) string {
	var b strings.Builder
	if res.IsError {
		b.WriteString("Error:\n")
	}
	for _, c := range res.Content {
		switch c.Type {
		case "text":
			b.WriteString(c.Text)
		case "image":
			fmt.Fprintf(&b, "\n[%s image attached separately]", c.MIMEType)
		}
	}
	return b.String()
}

// scriptedModel plays the model: it writes Python to count the letter,
// then answers from what Kiln returned. The number in the answer is
// Kiln's: the script does not know it.
func scriptedModel(_ context.Context, req chatRequest) (message, error) {
	last := req.Messages[len(req.Messages)-1]
	switch last.Role {
	case "user":
		call := toolCall{ID: "call_1", Type: "function"}
		call.Function.Name = "execute_python"
		call.Function.Arguments = `{"code":"word = \"strawberry\"\nword.count(\"r\")"}`
		return message{Role: "assistant", ToolCalls: []toolCall{call}}, nil
	case "tool":
		if strings.HasPrefix(last.Content, "Error:") {
			return message{}, fmt.Errorf("the tool failed: %s", last.Content)
		}
		return message{Role: "assistant", Content: fmt.Sprintf("The letter r appears %s times in \"strawberry\".", strings.TrimSpace(last.Content))}, nil
	}
	return message{}, fmt.Errorf("unexpected last message from %s", last.Role)
}

// openAIModel asks a model through the Chat Completions API at base.
func openAIModel(base, key, name string) model {
	return func(ctx context.Context, req chatRequest) (message, error) {
		req.Model = name
		body, err := json.Marshal(req)
		if err != nil {
			return message{}, err
		}
		hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/chat/completions", bytes.NewReader(body))
		if err != nil {
			return message{}, err
		}
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			return message{}, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return message{}, fmt.Errorf("chat completions: %s: %s", resp.Status, b)
		}
		var out chatResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return message{}, fmt.Errorf("chat completions: %w", err)
		}
		if len(out.Choices) == 0 {
			return message{}, errors.New("chat completions: no choices")
		}
		return out.Choices[0].Message, nil
	}
}

// show prints one step of the loop as JSON.
func show(log io.Writer, step string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(log, "%s: %s\n", step, b)
}

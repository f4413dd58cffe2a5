package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// The whole life of a sandbox: create it, run a command in it, move files
// in and out, and kill it. It needs a running server (kiln serve) and
// KILN_URL and KILN_API_KEY in the environment.
func Example() {
	ctx := context.Background()
	c := client.FromEnv()

	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{
		Template: "base",
		Timeout:  600, // seconds
		Limits:   api.Limits{MemoryBytes: 512 << 20},
		Metadata: map[string]string{"job": "example"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.ID)

	// Upload a script, run it streaming its output, download what it wrote.
	if _, err := c.WriteFile(ctx, sb.ID, "hello.py", strings.NewReader(`open("out.txt", "w").write("hi\n")`)); err != nil {
		log.Fatal(err)
	}
	res, err := c.Run(ctx, sb.ID, api.CommandRequest{Args: []string{"python3", "hello.py"}}, client.RunOptions{
		OnStdout: func(b []byte) { os.Stdout.Write(b) },
		OnStderr: func(b []byte) { os.Stderr.Write(b) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.Exit.Code)
	if _, err := c.ReadFile(ctx, sb.ID, "out.txt", os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Run streams a command's output; a dropped connection is resumed with
// Attach from the last event seen.
func ExampleClient_Run() {
	ctx := context.Background()
	c := client.FromEnv()
	id := "sbx_…" // from CreateSandbox

	opts := client.RunOptions{OnStdout: func(b []byte) { os.Stdout.Write(b) }}
	res, err := c.Run(ctx, id, api.CommandRequest{Cmd: "for i in 1 2 3; do echo $i; sleep 1; done"}, opts)
	var dropped *client.DroppedError
	if errors.As(err, &dropped) {
		res, err = c.Attach(ctx, id, dropped.PID, dropped.LastSeq, opts)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pid %d exited with %d\n", res.PID, res.Exit.Code)
}

// Start runs a command in the background; SendStdin feeds it and Attach
// follows it.
func ExampleClient_Start() {
	ctx := context.Background()
	c := client.FromEnv()
	id := "sbx_…"

	pid, err := c.Start(ctx, id, api.CommandRequest{Args: []string{"wc", "-l"}, Stdin: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.SendStdin(ctx, id, pid, []byte("a\nb\n"), true); err != nil {
		log.Fatal(err)
	}
	res, err := c.Attach(ctx, id, pid, 0, client.RunOptions{OnStdout: func(b []byte) { os.Stdout.Write(b) }})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.Exit.Code)
}

// UploadFiles sends several files in one streamed request.
func ExampleClient_UploadFiles() {
	ctx := context.Background()
	c := client.FromEnv()
	f, err := os.Open("data.csv")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	infos, err := c.UploadFiles(ctx, "sbx_…", "/home/user/project", []client.Upload{
		{Path: "main.py", Content: strings.NewReader("print(open('data.csv').read())")},
		{Path: "data.csv", Content: f},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, fi := range infos {
		fmt.Println(fi.Path, fi.Size)
	}
}

// AllSandboxes pages through every sandbox a filter selects.
func ExampleClient_AllSandboxes() {
	ctx := context.Background()
	c := client.FromEnv()
	f := client.ListFilter{States: []string{"running"}, Metadata: map[string]string{"job": "example"}}
	for sb, err := range c.AllSandboxes(ctx, f) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(sb.ID, sb.State, time.Until(sb.ExpiresAt).Round(time.Second))
	}
}

// Errors from the server are *client.Error; IsCode classifies them.
func ExampleIsCode() {
	ctx := context.Background()
	c := client.FromEnv()
	_, err := c.GetSandbox(ctx, "sbx_gone")
	var e *client.Error
	switch {
	case client.IsCode(err, api.CodeNotFound):
		fmt.Println("no such sandbox")
	case errors.As(err, &e):
		fmt.Printf("HTTP %d %s: %s (request %s)\n", e.Status, e.Code, e.Message, e.RequestID)
	case err != nil:
		fmt.Println("talking to the server:", err)
	}
}

// Watch reports changes under a directory until the context ends.
func ExampleClient_Watch() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := client.FromEnv()
	err := c.Watch(ctx, "sbx_…", "/home/user", true, func(ev api.Event) error {
		fmt.Println(ev.File.Op, ev.File.Path)
		return nil
	})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Fatal(err)
	}
}

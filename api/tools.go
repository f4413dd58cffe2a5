package api

// ToolContent is one piece of a tool's result for a language model: text,
// or an image (a chart the code drew) as base64 data. It has the shape of
// MCP's text and image content.
type ToolContent struct {
	Type     string `json:"type"`                // "text" or "image"
	Text     string `json:"text,omitempty"`      // with type "text"
	Data     string `json:"data,omitempty"`      // with type "image": base64
	MIMEType string `json:"mime_type,omitempty"` // with type "image", e.g. "image/png"
}

// ToolResult is the answer to POST /v1/sandboxes/{id}/tools/{name}: what
// to hand back to the model as the tool call's result. IsError marks a
// failed call (an exception, a non-zero exit, a missing file); its text
// says why, for the model to read and correct.
type ToolResult struct {
	Content []ToolContent `json:"content"`
	IsError bool          `json:"is_error,omitempty"`
}

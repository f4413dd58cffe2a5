// Package e2b makes Kiln speak E2B's wire protocol, so the stock E2B SDKs
// work against kiln serve unchanged: the control plane (/sandboxes,
// /v2/sandboxes, ...), routing of data-plane requests by the
// E2b-Sandbox-Id / E2b-Sandbox-Port headers (or a <port>-<id>.<domain>
// host), the code-interpreter endpoints (port 49999) and, through package
// envd, the envd services (port 49983). Everything is translated onto
// sandbox.Manager and the sandbox's Agent: there is no second sandbox
// implementation, and nothing E2B-specific leaks into other packages.
package e2b

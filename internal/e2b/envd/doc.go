// Package envd serves E2B's envd API (sandbox port 49983) for one Kiln
// sandbox: the Connect-RPC services process.Process and
// filesystem.Filesystem (JSON and binary codecs) and the plain HTTP
// endpoints /files (incl. signed URLs), /health and /envs, translated onto
// the sandbox's Agent.
package envd

// Version is the envd version Kiln declares to the SDKs (envdVersion in
// the control plane's answers). The SDKs gate features on it, so it must
// be the highest envd version whose features are all implemented here
// (see e2b-protocol.md §3.8); never below 0.4.0.
const Version = "0.4.0"

// Package envd serves E2B's envd API (sandbox port 49983) for one Kiln
// sandbox: the Connect-RPC services process.Process and
// filesystem.Filesystem (JSON and binary codecs) and the plain HTTP
// endpoints /files (incl. signed URLs), /health and /envs, translated onto
// the sandbox's Agent.
package envd

// Version is the envd version Kiln declares to the SDKs (envdVersion in
// the control plane's answers). The SDKs gate features on it, so it must
// be the highest envd version whose features are all implemented here
// (see e2b-protocol.md §3.8); never below 0.4.0. All of the SDKs' gates
// up to 0.6.4 are implemented: stdin (0.3.0), the default user (0.4.0),
// CloseStdin (0.5.2), octet-stream and gzip uploads (0.5.7), file
// metadata as user.e2b.* extended attributes (0.6.2), watch entries
// (0.6.3) and the allowNetworkMounts flag (0.6.4; Kiln sandboxes have no
// network mounts). Later envd versions add nothing the SDKs gate on that
// is verified here, so Kiln does not claim them.
const Version = "0.6.4"

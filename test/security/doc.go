// Package security is Kiln's security suite: attempts to escape a sandbox
// or spy on the host and other sandboxes, and to exhaust resources, run
// against every runtime (runsc and runc) with real sandboxes. Each attack
// has a name, the outcome it must get, and, for resource attacks, a
// measurement of a neighbour sandbox's and the host's responsiveness while
// it runs. docs/security.md maps each isolation claim to the test that
// proves it. The package holds only tests.
package security

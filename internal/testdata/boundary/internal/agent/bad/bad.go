// Package bad is in-sandbox code that imports a host package: the boundary
// test must report it.
package bad

import "example.com/fixture/internal/server"

// Name leaks the host package into the sandbox side.
const Name = server.Name

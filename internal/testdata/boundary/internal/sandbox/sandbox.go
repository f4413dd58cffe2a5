// Package sandbox imports a front end, which the layering forbids.
package sandbox

import "example.com/fixture/internal/server"

// Name is the front end's.
const Name = server.Name

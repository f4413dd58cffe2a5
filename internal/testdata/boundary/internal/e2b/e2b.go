// Package e2b imports the native front end, which the layering forbids:
// both front ends meet only in the edge.
package e2b

import "example.com/fixture/internal/server"

// Name is the other front end's.
const Name = server.Name

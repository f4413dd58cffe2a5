// Package edge imports a front end, which the layering forbids: the front
// ends import the edge, not the other way round.
package edge

import "example.com/fixture/internal/server"

// Name is the front end's.
const Name = server.Name

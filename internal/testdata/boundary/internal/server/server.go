// Package server stands for a host-side package.
package server

// Name is imported by the wrong packages of this fixture.
const Name = "server"

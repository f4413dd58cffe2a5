module github.com/kiln-sh/kiln

go 1.26.8

require (
	github.com/opencontainers/runtime-spec v1.2.0
	golang.org/x/sys v0.49.0
)

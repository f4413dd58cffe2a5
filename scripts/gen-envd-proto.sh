#!/bin/sh
# Regenerates the Go code of E2B's envd services (internal/e2b/envd/spec)
# from their .proto files. The output is committed, so builds and CI need
# no protoc. Needs: protoc (apt-get install protobuf-compiler),
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
# (the versions in go.mod).
set -eu
cd "$(dirname "$0")/../internal/e2b/envd/spec"
PATH="$(go env GOPATH)/bin:$PATH"
for svc in process filesystem; do
	protoc -I . \
		--go_out=. --go_opt=paths=source_relative \
		--connect-go_out=. --connect-go_opt=paths=source_relative \
		"$svc/$svc.proto"
done

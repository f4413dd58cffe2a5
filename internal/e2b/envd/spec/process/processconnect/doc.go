// Package processconnect is generated from E2B envd's process.proto (scripts/gen-envd-proto.sh):
// the Connect client and handler of its process service.
package processconnect

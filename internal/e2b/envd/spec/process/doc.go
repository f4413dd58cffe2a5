// Package process is generated from E2B envd's process.proto (scripts/gen-envd-proto.sh):
// the message types of its process service.
package process

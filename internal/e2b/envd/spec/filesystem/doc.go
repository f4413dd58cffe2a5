// Package filesystem is generated from E2B envd's filesystem.proto (scripts/gen-envd-proto.sh):
// the message types of its filesystem service.
package filesystem

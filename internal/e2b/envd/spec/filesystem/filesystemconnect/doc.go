// Package filesystemconnect is generated from E2B envd's filesystem.proto (scripts/gen-envd-proto.sh):
// the Connect client and handler of its filesystem service.
package filesystemconnect

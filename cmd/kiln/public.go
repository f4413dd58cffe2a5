package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"

	"github.com/kiln-sh/kiln/internal/config"
)

// publicListener is ln as clients use it: wrapped in TLS with p's
// certificate when p has one. Only HTTP/1.1 is offered: the edge's
// per-connection accounting (internal/edge) is HTTP/1.1's, and the SDKs
// fall back to it.
func publicListener(ln net.Listener, p config.Public) (net.Listener, error) {
	if !p.TLS() {
		return ln, nil
	}
	cert, err := tls.LoadX509KeyPair(p.TLSCert, p.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS certificate (KILN_TLS_CERT, KILN_TLS_KEY): %w", err)
	}
	return tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	}), nil
}

// sandboxDomain is the domain kiln serve gives the SDKs for its
// sandboxes: p's, else DefaultDomain of the port it listens on.
func sandboxDomain(p config.Public, addr net.Addr) string {
	if p.Domain != "" {
		return p.Domain
	}
	port := 0
	if _, s, err := net.SplitHostPort(addr.String()); err == nil {
		port, _ = strconv.Atoi(s)
	}
	return config.DefaultDomain(port, p.TLS())
}

package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Public is how clients reach kiln serve: the domain its sandboxes'
// ports are served under and the certificate it serves HTTPS with.
type Public struct {
	// Domain is the sandboxes' domain (KILN_DOMAIN): E2B's SDKs build
	// sandbox.getHost(port) as <port>-<sandbox id>.<Domain>, and kiln
	// serve routes those hosts to the sandbox's port. host or host:port;
	// "" defaults to localhost:<listen port> (DefaultDomain).
	Domain string
	// TLSCert and TLSKey are PEM files (KILN_TLS_CERT, KILN_TLS_KEY): when
	// given, the API and the sandbox hosts are served over HTTPS only. The
	// certificate should name the API's host and *.<domain>.
	TLSCert, TLSKey string
}

// TLS reports whether kiln serve serves HTTPS.
func (p Public) TLS() bool { return p.TLSCert != "" }

// Scheme is "https" with a certificate, else "http".
func (p Public) Scheme() string {
	if p.TLS() {
		return "https"
	}
	return "http"
}

func publicFromEnv(p Public) Public {
	for dst, key := range map[*string]string{&p.Domain: "KILN_DOMAIN", &p.TLSCert: "KILN_TLS_CERT", &p.TLSKey: "KILN_TLS_KEY"} {
		if v := os.Getenv(key); v != "" {
			*dst = v
		}
	}
	return p
}

// DefaultDomain is the sandboxes' domain when none is configured:
// localhost with the port kiln serve listens on (left out when it is the
// scheme's own), so that <port>-<id>.localhost:<listen port> names this
// server wherever *.localhost resolves to loopback (RFC 6761: curl,
// browsers, systemd-resolved and nss-myhostname do; plain glibc with
// "hosts: files dns" does not).
func DefaultDomain(listenPort int, tls bool) string {
	if (tls && listenPort == 443) || (!tls && listenPort == 80) {
		return "localhost"
	}
	return "localhost:" + strconv.Itoa(listenPort)
}

func (p Public) validate() error {
	var errs []error
	if p.Domain != "" {
		if err := validDomain(p.Domain); err != nil {
			errs = append(errs, fmt.Errorf("domain %q (KILN_DOMAIN, --domain): %w", p.Domain, err))
		}
	}
	if (p.TLSCert == "") != (p.TLSKey == "") {
		errs = append(errs, errors.New("TLS needs both a certificate and a key (KILN_TLS_CERT and KILN_TLS_KEY, --tls-cert and --tls-key)"))
	}
	return errors.Join(errs...)
}

// validDomain accepts a DNS name with an optional :port: what the SDKs
// put after "<port>-<id>." in a URL.
func validDomain(d string) error {
	host := d
	if h, port, err := net.SplitHostPort(d); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("want host or host:port")
		}
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	if host == "" || len(host) > 253 {
		return errors.New("want host or host:port")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("want a DNS name such as sandboxes.example.com, without scheme or path")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return errors.New("want a DNS name such as sandboxes.example.com, without scheme or path")
			}
		}
	}
	return nil
}

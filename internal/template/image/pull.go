package image

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Pull resolves ref (e.g. "debian:bookworm", "127.0.0.1:5000/app:v1",
// "ghcr.io/org/app@sha256:…") in its registry to its linux/amd64 image.
// auth nil (or empty) pulls anonymously; a password without a username is
// sent as a bearer token. Registries on loopback and private addresses are
// spoken to over plain HTTP, others over HTTPS (go-containerregistry's
// rule). ctx bounds every request made for the image, including the layer
// downloads of later Unpack calls. guard (nil: none) says which
// addresses the pull may connect to.
func Pull(ctx context.Context, ref string, auth *api.RegistryAuth, guard Guard) (*Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("malformed image reference %q: want [registry/]repository[:tag|@sha256:digest]: %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	}
	p := puller{ctx: ctx, ref: ref, host: r.Context().RegistryStr(), anonymous: authenticator(auth) == authn.Anonymous}
	img, err := p.resolve(r, remote.WithContext(ctx), remote.WithPlatform(Platform),
		remote.WithAuth(authenticator(auth)), remote.WithUserAgent("kiln"), remote.WithTransport(guarded(guard)))
	if err != nil {
		return nil, p.explain(err)
	}
	return img, nil
}

type puller struct {
	ctx       context.Context
	ref, host string
	anonymous bool
}

func (p puller) resolve(r name.Reference, opts ...remote.Option) (*Image, error) {
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, err
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		if img, err = fromIndex(p.ref, idx, 0); err != nil {
			return nil, err
		}
	case desc.MediaType.IsImage():
		if img, err = desc.Image(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("image %s is a %s, not an OCI or Docker schema 2 image: %w", errdefs.Clip(p.ref), errdefs.Clip(string(desc.MediaType)), errdefs.ErrInvalidArgument)
	}
	return newImage(p.ref, img)
}

// authenticator turns a recipe's credentials into go-containerregistry's.
func authenticator(a *api.RegistryAuth) authn.Authenticator {
	switch {
	case a == nil || (a.Username == "" && a.Password == ""):
		return authn.Anonymous
	case a.Username == "":
		return &authn.Bearer{Token: a.Password}
	default:
		return &authn.Basic{Username: a.Username, Password: a.Password}
	}
}

// explain turns an error from pulling into one a user can act on, with
// its errdefs class. It quotes no credentials: go-containerregistry sends
// them in headers, never in the URLs its errors name.
func (p puller) explain(err error) error {
	ref := errdefs.Clip(p.ref)
	if cerr := p.ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("pulling %s: registry %s did not answer in time: %w", ref, p.host, errdefs.ErrDeadlineExceeded)
		}
		return fmt.Errorf("pulling %s: %w", ref, cerr)
	}
	if errors.Is(err, errdefs.ErrInvalidArgument) { // said here already
		return err
	}
	if errors.Is(err, errRefusedAddr) {
		return fmt.Errorf("registry %s is at an address template builds may not pull from (this host's loopback, "+
			"link-local or cloud metadata addresses): %w", p.host, errdefs.ErrPermissionDenied)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return p.explainStatus(te)
	}
	if cause := networkCause(err); cause != "" {
		return fmt.Errorf("registry %s is unreachable (%s): %w", p.host, cause, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("image %s from registry %s is not a usable image: %s: %w", ref, p.host, errdefs.ClipN(err.Error(), 300), errdefs.ErrInvalidArgument)
}

func (p puller) explainStatus(te *transport.Error) error {
	ref := errdefs.Clip(p.ref)
	has := func(codes ...transport.ErrorCode) bool {
		for _, d := range te.Errors {
			for _, c := range codes {
				if d.Code == c {
					return true
				}
			}
		}
		return false
	}
	switch {
	case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
		has(transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
		// Registries answer 401 both for a wrong password and, to
		// anonymous clients, for a repository that does not exist.
		if p.anonymous {
			return fmt.Errorf("registry %s refused anonymous access to %s: it needs credentials, or the image does not exist: %w", p.host, ref, errdefs.ErrPermissionDenied)
		}
		return fmt.Errorf("registry %s refused the credentials for %s: %w", p.host, ref, errdefs.ErrPermissionDenied)
	case te.StatusCode == http.StatusNotFound ||
		has(transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
		return fmt.Errorf("image %s not found in registry %s: %w", ref, p.host, errdefs.ErrNotFound)
	case te.StatusCode == http.StatusTooManyRequests || has(transport.TooManyRequestsErrorCode):
		return fmt.Errorf("registry %s is rate-limiting pulls of %s; try again later: %w", p.host, ref, errdefs.ErrResourceExhausted)
	default:
		return fmt.Errorf("registry %s answered %d %s to pulling %s: %w", p.host, te.StatusCode, http.StatusText(te.StatusCode), ref, errdefs.ErrUnavailable)
	}
}

// networkCause is a short reason when err is a failure to reach a server
// (refused, no route, DNS, TLS, timeout), else "".
func networkCause(err error) string {
	var (
		dns   *net.DNSError
		errno syscall.Errno
		cert  *tls.CertificateVerificationError
		x509u x509.UnknownAuthorityError
		rec   tls.RecordHeaderError
		ne    net.Error
		ue    *url.Error
	)
	switch {
	case errors.As(err, &dns):
		return "cannot resolve " + errdefs.ClipN(dns.Name, 100)
	case errors.As(err, &errno):
		return errno.Error()
	case errors.As(err, &cert), errors.As(err, &x509u):
		return "its TLS certificate is not trusted"
	case errors.As(err, &rec):
		return "it does not speak TLS"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.As(err, &ue):
		return "network error"
	}
	return ""
}

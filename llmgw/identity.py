"""Who is at the other end of a call: llmgw's SPIFFE identities, read off certificates and
off a call's verified client certificate.

Identity scheme. A peer's identity is the one URI SAN of its client certificate, a SPIFFE ID
in the trust domain `llmgw`:

- `spiffe://llmgw/node/NAME`: the agent of node NAME (may Connect as NAME only);
- `spiffe://llmgw/user/NAME`: a caller (a person, the gateway, `admin`, `viewer`), whose roles
  the cluster settings give.

Why URI SANs and not DNS names or the CN: the kind (node or user) is part of the name, so a
server certificate (DNS `localhost`) can never pass for a node and a user called `gpu-1` never
for node `gpu-1`; SPIFFE (spiffe.io, X.509-SVID) fixes the form, exactly one URI SAN, which
Envoy, Istio and SPIRE already issue and check; the CN is deprecated for identity (RFC 6125 6.4.4)
and DNS names are limited to hostname characters and mean "where to dial", not "who".
Names are 1-63 characters of letters, digits, `.`, `_`, `-`, starting with a letter or digit
(a DNS label's length, so a node's hostname fits).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes

log = structlog.get_logger(__name__)

TRUST_DOMAIN = "llmgw"
NODE = "node"
USER = "user"
_KINDS = (NODE, USER)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class IdentityError(ValueError):
    """A name or URI that is not an llmgw identity."""


@dataclass(frozen=True)
class Identity:
    """Who a peer is: `kind` is "node" or "user"."""

    kind: str
    name: str

    @property
    def uri(self) -> str:
        """The SPIFFE ID, `spiffe://llmgw/KIND/NAME`."""
        return f"spiffe://{TRUST_DOMAIN}/{self.kind}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def check_name(name: str) -> str:
    """`name` when it may be a node's or a user's name; IdentityError saying why when not."""
    if not _NAME.fullmatch(name) or ".." in name:
        shown = name[:80]
        raise IdentityError(
            f"{shown!r} cannot be an identity: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def node_uri(name: str) -> str:
    """`spiffe://llmgw/node/NAME`, the SAN of node NAME's agent certificate."""
    return Identity(NODE, check_name(name)).uri


def user_uri(name: str) -> str:
    """`spiffe://llmgw/user/NAME`, the SAN of caller NAME's certificate."""
    return Identity(USER, check_name(name)).uri


def parse_identity(uri: str) -> Identity:
    """The identity a SPIFFE ID names.

    Raises:
        IdentityError: not `spiffe://llmgw/node/NAME` or `spiffe://llmgw/user/NAME` exactly
            (another trust domain, another kind, a query, a fragment, extra segments, a bad
            name).
    """
    prefix = f"spiffe://{TRUST_DOMAIN}/"
    if not uri.startswith(prefix):
        raise IdentityError(f"{uri[:120]!r} is not an identity of trust domain {TRUST_DOMAIN}")
    parts = uri[len(prefix) :].split("/")
    if len(parts) != 2 or parts[0] not in _KINDS:
        raise IdentityError(
            f"{uri[:120]!r} is not spiffe://{TRUST_DOMAIN}/node/NAME or "
            f"spiffe://{TRUST_DOMAIN}/user/NAME"
        )
    return Identity(parts[0], check_name(parts[1]))


def identity_of_uris(uris: Sequence[str]) -> Identity:
    """The identity of a certificate whose URI SANs are `uris`: exactly one, an llmgw ID
    (X.509-SVID's rule: one URI SAN, so a certificate cannot be two peers at once).

    Raises:
        IdentityError: none, several, or not an llmgw identity.
    """
    if len(uris) != 1:
        raise IdentityError(
            f"a peer certificate must carry exactly one URI SAN (spiffe://{TRUST_DOMAIN}/...); "
            f"this one has {len(uris)}"
        )
    return parse_identity(uris[0])


@functools.lru_cache(maxsize=4096)
def identity_of_certificate(pem: bytes) -> Identity:
    """The identity of a PEM certificate (the first one, when it is a chain).

    Raises:
        IdentityError: the certificate cannot be parsed or carries no single llmgw identity.
    """
    try:
        cert = x509.load_pem_x509_certificates(pem)[0]
    except (ValueError, IndexError) as exc:
        raise IdentityError(f"the peer certificate cannot be read: {exc}") from exc
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    return identity_of_uris(uris)


@dataclass(frozen=True)
class CertificateIds:
    """What names one certificate beside its identity, for revoking it alone: its serial
    number and its SHA-256 fingerprint (of the DER bytes, as `openssl x509 -fingerprint
    -sha256` prints it), both lower-case hex without separators."""

    serial: str
    fingerprint: str


@functools.lru_cache(maxsize=4096)
def certificate_ids(pem: bytes) -> CertificateIds | None:
    """The serial and fingerprint of a PEM certificate (the first of a chain); None when it
    cannot be read."""
    try:
        cert = x509.load_pem_x509_certificates(pem)[0]
    except (ValueError, IndexError):
        return None
    return CertificateIds(
        serial=f"{cert.serial_number:x}",
        fingerprint=cert.fingerprint(hashes.SHA256()).hex(),
    )


def peer_certificate_ids(
    context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any],
) -> CertificateIds | None:
    """The serial and fingerprint of the caller's verified client certificate; None without
    one."""
    value = context.auth_context().get("x509_pem_cert")
    pem = value if isinstance(value, bytes) else next(iter(value or ()), b"")
    return certificate_ids(pem) if pem else None


def peer_identity(
    context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any],
) -> Identity | None:
    """The verified identity of the caller of an RPC, None when it presented no certificate
    (plaintext, or TLS without client authentication) or one with no llmgw identity.

    Only a server started with `--tls-ca` asks for and verifies client certificates; grpc
    puts the verified leaf in the call's auth context (`x509_pem_cert`)."""
    auth = context.auth_context()
    value = auth.get("x509_pem_cert")
    pem = value if isinstance(value, bytes) else next(iter(value or ()), b"")
    if not pem:
        return None
    try:
        return identity_of_certificate(pem)
    except IdentityError as exc:
        log.info("peer_identity_refused", error=str(exc))
        return None

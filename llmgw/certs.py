"""A local certificate authority and the certificates llmgw's services and callers present.

`llmgw up` makes one under `DATA/tls/`; `llmgw certs node NAME --ca-dir DIR` and
`llmgw certs client NAME --ca-dir DIR` issue more from it (`issue_node_files`,
`issue_client_files`: the CLI only parses their arguments). Keys are ECDSA P-256 (every TLS
stack grpc builds with takes them, and they are cheap to make and to handshake with).

Identities follow `llmgw.tls`: a node's certificate carries the URI SAN
`spiffe://llmgw/node/NAME`, a caller's `spiffe://llmgw/user/NAME`; a server's carries the DNS
names and IP addresses clients dial (always `localhost` and `127.0.0.1`). Private keys are
written mode 0600, and the CA's key never leaves the CA directory.

Each pair has its own files, named after what it is for (`SERVICE`, `node-NAME`, `USER`): a
name that would make two roles share files (a caller called `fleet` beside the fleet's server
pair, a caller called `ca`) is refused, never answered with the other role's certificate or
written over it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.identity import node_uri, user_uri
from llmgw.tls import SERVICE_DOMAIN, service_name

__all__ = ["SERVICE_DOMAIN", "service_name"]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"

CA_DAYS = 3650
"""A local CA lives ten years: replacing it means reissuing every certificate."""
LEAF_DAYS = 397
"""Leaf certificates: the CA/Browser Forum's ceiling for public TLS certificates (397 days);
rotate sooner by issuing again."""
_BACKDATE = datetime.timedelta(minutes=5)
"""notBefore is set a little in the past so a peer whose clock lags still accepts a new one."""


class CertError(Exception):
    """A CA directory or certificate request that cannot be served; the message says why."""


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Authority:
    """A CA that can sign: its certificate and key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM (what clients and servers trust)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The CA's private key, PEM (PKCS#8, unencrypted: guard it)."""
        return _key_pem(self.key)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_authority(common_name: str = "llmgw local CA", *, days: int = CA_DAYS) -> Authority:
    """A new self-signed CA (in memory)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert=cert, key=key)


def _general_names(names: Sequence[str]) -> list[x509.GeneralName]:
    """DNS names and IP addresses as SAN entries (an entry that parses as an IP is one)."""
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue(
    ca: Authority,
    common_name: str,
    *,
    dns_or_ips: Sequence[str] = (),
    uris: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> Pair:
    """A leaf certificate signed by `ca`.

    Args:
        ca: the signing authority.
        common_name: the subject's CN (shown to people; identity is read from the SANs).
        dns_or_ips: DNS names and IP addresses for the SAN (what a server is dialled as).
        uris: URI SANs (llmgw identities, `spiffe://llmgw/...`).
        server: allow TLS server authentication.
        client: allow TLS client authentication.
        not_before: start of validity (default: a few minutes ago).
        not_after: end of validity (default: LEAF_DAYS from now; tests pass the past).

    Raises:
        CertError: neither server nor client use, or no SAN at all.
    """
    if not (server or client):
        raise CertError("a certificate must be for a server, a client or both")
    sans = _general_names(dns_or_ips) + [x509.UniformResourceIdentifier(u) for u in uris]
    if not sans:
        raise CertError("a certificate needs at least one subject alternative name")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - _BACKDATE)
        .not_valid_after(not_after or now + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


SERVER_NAMES = ("localhost", "127.0.0.1")
"""Every server certificate names these, so a client on the same machine can dial it."""


def names_service(cert_path: Path, service: str) -> bool:
    """Whether the certificate at `cert_path` carries `service`'s name (pairs issued before
    service names existed do not: their clients check the host name only)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return service_name(service) in san.get_values_for_type(x509.DNSName)


def issue_server(ca: Authority, name: str, *, hosts: Sequence[str] = ()) -> Pair:
    """A server pair for service `name`, valid for localhost, 127.0.0.1, `hosts` and the
    service's own name (`service_name`)."""
    names = list(dict.fromkeys([*SERVER_NAMES, *hosts, service_name(name)]))
    return issue(ca, name, dns_or_ips=names, server=True)


def issue_node(ca: Authority, node: str) -> Pair:
    """An agent's pair: client use, identity `spiffe://llmgw/node/NODE`."""
    return issue(ca, f"node {node}", uris=[node_uri(node)], client=True)


def issue_client(ca: Authority, user: str) -> Pair:
    """A caller's pair (admin, viewer, a gateway, a person): identity `spiffe://llmgw/user/USER`."""
    return issue(ca, user, uris=[user_uri(user)], client=True)


# -- files ------------------------------------------------------------------------------------


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write `data` to `path` atomically (a reader sees the old file or the new one, never half:
    servers re-read certificate files while they run), keys mode 0600 from the start.

    The temporary file has a name no one can guess and is created with O_EXCL|O_NOFOLLOW: in a
    shared folder, a symlink planted where it would go is never followed (the open fails
    rather than write a key through it), and the rename replaces a link at `path` itself
    rather than writing where it points."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o600 if private else 0o644)
    try:
        # The mode whatever the umask: 0600 for keys, 0644 for certificates.
        os.fchmod(fd, 0o600 if private else 0o644)
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _use(cert: x509.Certificate) -> tuple[frozenset[str], frozenset[str]]:
    """What a leaf is for: its extended key usages and its URI SANs (llmgw identities)."""
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        eku = frozenset(u.dotted_string for u in usages)
    except x509.ExtensionNotFound:
        eku = frozenset()
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = frozenset(alt.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        uris = frozenset()
    return eku, uris


def _check_replaces(cert_path: Path, pair: Pair) -> None:
    """A pair written over `cert_path` must be for what the certificate there is for (a
    rotation): not a caller's pair over a server's, nor one identity's over another's.

    Raises:
        CertError: the file there is another role's certificate, or not one.
    """
    if not cert_path.exists():
        return
    try:
        old = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(
            f"{cert_path} is there and is not a certificate ({exc}); not writing over it"
        ) from exc
    new = x509.load_pem_x509_certificate(pair.cert_pem)
    if _use(old) != _use(new):
        raise CertError(
            f"{cert_path} holds the certificate of {_describe(old)}, not of "
            f"{_describe(new)}: each role needs its own pair; pick another name "
            "(or another output folder)"
        )


def _describe(cert: x509.Certificate) -> str:
    """A certificate's role for people: its llmgw identities, else its purposes."""
    eku, uris = _use(cert)
    if uris:
        return " ".join(sorted(uris))
    names = {
        ExtendedKeyUsageOID.SERVER_AUTH.dotted_string: "server",
        ExtendedKeyUsageOID.CLIENT_AUTH.dotted_string: "client",
    }
    uses = "/".join(sorted(names.get(u, u) for u in eku)) or "no-purpose"
    return f"a {uses} ({cert.subject.rfc4514_string()})"


RESERVED_STEM = CA_CERT.removesuffix(".crt")
"""`ca`: the CA's own files; no pair is written under that name."""


def write_pair(folder: Path, stem: str, pair: Pair) -> tuple[Path, Path]:
    """Write `STEM.crt` and `STEM.key` (0600) under `folder`; returns their paths.

    Raises:
        CertError: `stem` is the CA's (`ca`), or `STEM.crt` is there for another role
            (a server's, another identity's).
    """
    if stem == RESERVED_STEM:
        raise CertError(
            f"{stem!r} names the CA's own files ({CA_CERT}, {CA_KEY}): pick another name"
        )
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    _check_replaces(cert_path, pair)
    folder.mkdir(parents=True, exist_ok=True)
    # The key first: a server watching the pair sees a new cert only once its key is there.
    _write(key_path, pair.key_pem, private=True)
    _write(cert_path, pair.cert_pem, private=False)
    return cert_path, key_path


def init_ca(ca_dir: Path, common_name: str = "llmgw local CA") -> Authority:
    """Make a CA under `ca_dir` (`ca.crt`, `ca.key` mode 0600), or load the one already there."""
    if (ca_dir / CA_CERT).exists() or (ca_dir / CA_KEY).exists():
        return load_ca(ca_dir)
    ca_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(ca_dir, 0o700)
    ca = new_authority(common_name)
    _write(ca_dir / CA_KEY, ca.key_pem, private=True)
    _write(ca_dir / CA_CERT, ca.cert_pem, private=False)
    return ca


def load_ca(ca_dir: Path) -> Authority:
    """The CA under `ca_dir`.

    Raises:
        CertError: the files are missing, unreadable, not a CA or its key does not match.
    """
    try:
        cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), None)
    except FileNotFoundError as exc:
        raise CertError(
            f"{ca_dir} holds no CA ({exc.filename} is missing); make one with `llmgw up` or "
            "point --ca-dir at the folder that has ca.crt and ca.key"
        ) from exc
    except (OSError, ValueError) as exc:
        raise CertError(f"the CA under {ca_dir} cannot be read: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{ca_dir / CA_KEY} is not an EC key this CA would have made")
    if key.public_key() != cert.public_key():
        raise CertError(f"{ca_dir / CA_KEY} is not the key of {ca_dir / CA_CERT}")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertError(f"{ca_dir / CA_CERT} is not a CA certificate")
    return Authority(cert=cert, key=key)


def issue_server_files(
    name: str, ca_dir: Path, out_dir: Path | None = None, *, hosts: Sequence[str] = ()
) -> tuple[Path, Path]:
    """A new server pair `NAME.crt/.key` (to `out_dir`, default the CA folder), written key
    first and each file atomically: how a running server's certificate is rotated."""
    ca = load_ca(ca_dir)
    return write_pair(out_dir or ca_dir, name, issue_server(ca, name, hosts=hosts))


def issue_node_files(node: str, ca_dir: Path, out_dir: Path | None = None) -> tuple[Path, Path]:
    """`llmgw certs node NAME --ca-dir DIR`: write `node-NAME.crt/.key` (to `out_dir`, default
    the CA folder) and return their paths. Raises CertError (bad CA) or ValueError (bad name)."""
    ca = load_ca(ca_dir)
    return write_pair(out_dir or ca_dir, f"node-{node}", issue_node(ca, node))


def issue_client_files(user: str, ca_dir: Path, out_dir: Path | None = None) -> tuple[Path, Path]:
    """`llmgw certs client NAME --ca-dir DIR`: write `NAME.crt/.key` (to `out_dir`, default the
    CA folder) and return their paths. Raises CertError (bad CA) or ValueError (bad name)."""
    ca = load_ca(ca_dir)
    return write_pair(out_dir or ca_dir, user, issue_client(ca, user))


def _check_stems(servers: Sequence[str], nodes: Sequence[str], clients: Sequence[str]) -> None:
    """Every role make_local_tls is asked for gets files of its own.

    Raises:
        CertError: naming both roles and the files they would share.
    """
    owners = {RESERVED_STEM: "the CA"}
    roles = (
        ("server", servers, lambda n: n),
        ("node", nodes, lambda n: f"node-{n}"),
        ("client", clients, lambda n: n),
    )
    for kind, names, stem_of in roles:
        for name in dict.fromkeys(names):
            stem, role = stem_of(name), f"{kind} {name!r}"
            if stem in owners:
                raise CertError(
                    f"{role} and {owners[stem]} would share {stem}.crt/.key, and a "
                    "certificate is for one role (a server's has server use only, a caller's "
                    f"client use and its own identity): name the {kind} differently"
                )
            owners[stem] = role


@dataclass(frozen=True)
class LocalTLS:
    """What `make_local_tls` wrote: the CA and one pair per role, as paths."""

    folder: Path
    ca_cert: Path
    servers: dict[str, tuple[Path, Path]]
    nodes: dict[str, tuple[Path, Path]]
    clients: dict[str, tuple[Path, Path]]


def make_local_tls(
    folder: Path,
    *,
    servers: Sequence[str] = ("planner", "fleet"),
    nodes: Sequence[str] = ("local",),
    clients: Sequence[str] = ("admin", "viewer"),
    hosts: Sequence[str] = (),
) -> LocalTLS:
    """`llmgw up`'s `DATA/tls/`: a CA (kept if there), `SERVICE.crt/.key` per server,
    `node-NAME.crt/.key` per agent, `USER.crt/.key` per caller. Pairs already there are kept
    (a restart keeps the certificates clients were given).

    Raises:
        CertError: two roles would share files (a caller named as a server, `node-X` as a
            caller beside node `X`, anything named `ca`); nothing is written then.
    """
    _check_stems(servers, nodes, clients)
    ca = init_ca(folder)

    def kept_or(stem: str, name: str, make: Callable[[Authority, str], Pair]) -> tuple[Path, Path]:
        cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
        if cert_path.exists() and key_path.exists():
            return cert_path, key_path
        return write_pair(folder, stem, make(ca, name))

    def server(authority: Authority, name: str) -> Pair:
        return issue_server(authority, name, hosts=hosts)

    return LocalTLS(
        folder=folder,
        ca_cert=folder / CA_CERT,
        servers={n: kept_or(n, n, server) for n in servers},
        nodes={n: kept_or(f"node-{n}", n, issue_node) for n in nodes},
        clients={n: kept_or(n, n, issue_client) for n in clients},
    )

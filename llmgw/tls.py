"""Transport security for every llmgw server and client: credentials, and where plaintext may
listen. Who is at the other end of a call is llmgw/identity.py's.

Servers: `--tls-cert FILE --tls-key FILE [--tls-ca FILE]`; with `--tls-ca` a client certificate
signed by that CA is required. The files are re-read when they change (checked at each new
connection), so rotation needs no restart: new connections get the new certificate, open
streams keep the one they were made with. Without certificates a server listens on loopback
only (`bind` refuses anything else unless `insecure`), and says so at start.

Clients: `--tls-ca/--tls-cert/--tls-key`, or `LLMGW_TLS_CA`, `LLMGW_TLS_CERT`, `LLMGW_TLS_KEY`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = structlog.get_logger(__name__)

ENV_CA = "LLMGW_TLS_CA"
ENV_CERT = "LLMGW_TLS_CERT"
ENV_KEY = "LLMGW_TLS_KEY"
ENV_SERVER_NAME = "LLMGW_TLS_SERVER_NAME"

SERVICE_DOMAIN = "service.llmgw"
"""Server certificates also name their service as `NAME.service.llmgw` (a DNS SAN no host
has): a client that expects service NAME checks the server's certificate against that name
(`ClientTLS.expecting`), so the standard host-name check refuses a certificate of any other
service of the same CA (the planner's posing as the fleet)."""


def service_name(service: str) -> str:
    """The DNS SAN naming `service`: `fleet.service.llmgw`."""
    return f"{service}.{SERVICE_DOMAIN}"


class TLSConfigError(ValueError):
    """TLS settings that cannot work (a cert without its key, unreadable files, a plaintext
    listen off loopback without --insecure); the message says what to change."""


# -- where a server may listen ----------------------------------------------------------------


def listen_host(listen: str) -> str:
    """The host part of a grpc listen address (`HOST:PORT`, `[V6]:PORT`, `unix:PATH`)."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return "unix"
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """Whether a listen host reaches this machine only: `localhost`, 127.0.0.0/8, `::1`, or a
    unix socket. An empty host, `0.0.0.0`, `[::]` and every other name are not."""
    if host in ("unix", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate files; with `ca`, clients must present a certificate it signed."""

    cert: Path
    key: Path
    ca: Path | None = None

    @property
    def mutual(self) -> bool:
        """Whether a client certificate is required."""
        return self.ca is not None


def check_listen(listen: str, tls: ServerTLS | None, *, insecure: bool = False) -> str:
    """How a server will listen on `listen`: "tls", "mtls", "plaintext-loopback" or
    "plaintext-insecure".

    Raises:
        TLSConfigError: plaintext off loopback without `insecure`.
    """
    if tls is not None:
        return "mtls" if tls.mutual else "tls"
    if is_loopback(listen_host(listen)):
        return "plaintext-loopback"
    if insecure:
        return "plaintext-insecure"
    raise TLSConfigError(
        f"refusing to serve plaintext on {listen}: without certificates a server listens on "
        "loopback only (127.0.0.1, localhost, ::1); give --tls-cert, --tls-key and --tls-ca, "
        "or --insecure to serve plaintext to the network anyway"
    )


def bind(
    server: grpc.aio.Server | grpc.Server,
    listen: str,
    tls: ServerTLS | None,
    *,
    insecure: bool = False,
    service: str = "server",
) -> int:
    """Add `listen` to `server` with TLS when `tls` is given, plaintext otherwise (loopback
    only unless `insecure`); log how it listens; return the bound port.

    Raises:
        TLSConfigError: plaintext off loopback without `insecure`, or unusable TLS files.
        RuntimeError: the address could not be bound.
    """
    mode = check_listen(listen, tls, insecure=insecure)
    try:
        if tls is not None:
            port = server.add_secure_port(listen, server_credentials(tls))
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen on {listen}: {exc}") from exc
    if mode == "plaintext-loopback":
        log.warning(
            "listening_plaintext_loopback_only",
            service=service,
            listen=listen,
            note="no certificates given: plaintext, reachable from this machine only; give "
            "--tls-cert/--tls-key/--tls-ca to serve other machines",
        )
    elif mode == "plaintext-insecure":
        log.warning(
            "listening_plaintext_insecure",
            service=service,
            listen=listen,
            note="INSECURE: plaintext off loopback (--insecure); anyone who reaches this "
            "port can call every RPC as anyone",
        )
    else:
        log.info("listening_tls", service=service, listen=listen, mode=mode)
    return port


# -- server credentials, re-read on change ----------------------------------------------------


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"the {what} file {path} cannot be read: {exc.strerror}") from exc


def _check_pair(cert_pem: bytes, key_pem: bytes, tls: ServerTLS) -> None:
    """TLSConfigError unless `key_pem` is the private key of the first certificate."""
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        key = serialization.load_pem_private_key(key_pem, None)
    except (ValueError, IndexError, TypeError) as exc:
        raise TLSConfigError(f"{tls.cert} / {tls.key} is not a PEM pair: {exc}") from exc
    if key.public_key() != cert.public_key():
        raise TLSConfigError(f"{tls.key} is not the private key of {tls.cert}")


class CertificateReloader:
    """grpc's certificate-configuration fetcher for one ServerTLS: grpc calls it at each new
    connection; it answers a new configuration when a file's contents changed and the new
    pair is whole (a key that does not match its certificate, as mid-way through a copy,
    keeps the old one until the next connection), None (keep the current) otherwise.

    Contents, not mtimes, are compared: two rotations within the file system's timestamp
    granularity, with files of equal size (P-256 keys always are), would look unchanged.
    Reading three small files per new connection costs tens of microseconds; gRPC
    connections are long-lived."""

    def __init__(self, tls: ServerTLS) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self.reloads = 0
        """How many times new files were taken (for tests and logs)."""
        self._files = self._read_all()
        self.initial = self._configuration(self._files)

    def _read_all(self) -> tuple[bytes, bytes, bytes | None]:
        return (
            _read(self.tls.cert, "certificate"),
            _read(self.tls.key, "private key"),
            _read(self.tls.ca, "CA") if self.tls.ca else None,
        )

    def _configuration(self, files: tuple[bytes, bytes, bytes | None]) -> Any:
        cert, key, ca = files
        _check_pair(cert, key, self.tls)
        return grpc.ssl_server_certificate_configuration([(key, cert)], ca)

    def __call__(self) -> Any:
        try:
            with self._lock:
                files = self._read_all()
                if files == self._files:
                    return None
                config = self._configuration(files)
                self._files = files
                self.reloads += 1
        except TLSConfigError as exc:
            log.warning("tls_reload_deferred", cert=str(self.tls.cert), error=str(exc))
            return None
        log.info("tls_certificates_reloaded", cert=str(self.tls.cert), reloads=self.reloads)
        return config


def server_credentials(tls: ServerTLS) -> grpc.ServerCredentials:
    """Server credentials that re-read `tls`'s files when they change.

    Raises:
        TLSConfigError: a file cannot be read, or the key is not the certificate's.
    """
    reloader = CertificateReloader(tls)
    return grpc.dynamic_ssl_server_credentials(
        reloader.initial, reloader, require_client_authentication=tls.mutual
    )


def add_server_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """`--tls-cert`, `--tls-key`, `--tls-ca` and `--insecure` on a server's parser."""
    group = parser.add_argument_group("transport security")
    group.add_argument("--tls-cert", type=Path, help="the server's certificate (PEM)")
    group.add_argument("--tls-key", type=Path, help="the server's private key (PEM)")
    group.add_argument(
        "--tls-ca",
        type=Path,
        help="the CA that signs clients' certificates; given, a client certificate is required",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext on an address other than loopback (anyone who reaches it can "
        "call every RPC)",
    )


def server_tls_from_args(opts: argparse.Namespace) -> ServerTLS | None:
    """The ServerTLS the flags give, None for none.

    Raises:
        TLSConfigError: a certificate without its key (or the reverse), or --tls-ca alone.
    """
    cert, key, ca = opts.tls_cert, opts.tls_key, opts.tls_ca
    if cert is None and key is None:
        if ca is not None:
            raise TLSConfigError("--tls-ca needs --tls-cert and --tls-key (the server's pair)")
        return None
    if cert is None or key is None:
        raise TLSConfigError("--tls-cert and --tls-key go together: give both")
    return ServerTLS(cert=Path(cert), key=Path(key), ca=Path(ca) if ca else None)


# -- client credentials -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClientTLS:
    """A client's TLS files: the CA it trusts (None: the system's) and its own pair (None:
    no client certificate)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    """The name to check the server's certificate against when it is not the host dialled
    (a node dialling the fleet by an address its certificate does not list)."""

    def expecting(self, service: str) -> ClientTLS:
        """These settings checking the server as `service` (`fleet.service.llmgw`), unless a
        server name was given (`--tls-server-name`: a host name, for a pair that names no
        service)."""
        if self.server_name:
            return self
        return replace(self, server_name=service_name(service))

    def options(self) -> list[tuple[str, Any]]:
        """Channel options these settings need."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files (read now).

        Raises:
            TLSConfigError: a file cannot be read.
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "CA") if self.ca else None,
            private_key=_read(self.key, "private key") if self.key else None,
            certificate_chain=_read(self.cert, "certificate") if self.cert else None,
        )


def client_tls(
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    *,
    server_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ClientTLS | None:
    """The client TLS settings: each flag given wins over its environment variable
    (LLMGW_TLS_CA, LLMGW_TLS_CERT, LLMGW_TLS_KEY, LLMGW_TLS_SERVER_NAME); None when neither
    gives a file (plaintext).

    Raises:
        TLSConfigError: a certificate without its key, or the reverse.
    """
    environ = os.environ if env is None else env
    ca = ca or environ.get(ENV_CA) or None
    cert = cert or environ.get(ENV_CERT) or None
    key = key or environ.get(ENV_KEY) or None
    server_name = server_name or environ.get(ENV_SERVER_NAME) or None
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise TLSConfigError(
            "a client certificate and its key go together: give both --tls-cert and --tls-key "
            f"(or {ENV_CERT} and {ENV_KEY})"
        )
    return ClientTLS(
        ca=Path(ca) if ca else None,
        cert=Path(cert) if cert else None,
        key=Path(key) if key else None,
        server_name=server_name,
    )


def local_client_tls(tls_dir: Path, user: str = "admin") -> ClientTLS | None:
    """The pair `llmgw up` wrote for `user` under `tls_dir` (`ca.crt`, `USER.crt`, `USER.key`),
    None when it is not all there: how `llmgw ctl` beside a default `llmgw up` finds it."""
    ca, cert, key = tls_dir / "ca.crt", tls_dir / f"{user}.crt", tls_dir / f"{user}.key"
    if all(p.is_file() for p in (ca, cert, key)):
        return ClientTLS(ca=ca, cert=cert, key=key)
    return None


def add_client_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """`--tls-ca`, `--tls-cert`, `--tls-key` on a client's parser (defaults from the env,
    applied by `client_tls`)."""
    group = parser.add_argument_group("transport security")
    group.add_argument("--tls-ca", help=f"the CA that signed the server (env {ENV_CA})")
    group.add_argument("--tls-cert", help=f"this client's certificate (env {ENV_CERT})")
    group.add_argument("--tls-key", help=f"this client's private key (env {ENV_KEY})")
    group.add_argument(
        "--tls-server-name",
        help="the name to check the server's certificate against instead of the host dialled "
        "(`llmgw ctl`, `llmgw plan`: default SERVICE.service.llmgw; a host name for a pair "
        f"that names no service; env {ENV_SERVER_NAME})",
    )


def client_tls_from_args(opts: argparse.Namespace) -> ClientTLS | None:
    """`client_tls` from a parser that had `add_client_tls_arguments`."""
    return client_tls(
        opts.tls_ca, opts.tls_cert, opts.tls_key, server_name=getattr(opts, "tls_server_name", None)
    )


def aio_channel(
    target: str, tls: ClientTLS | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target`: TLS with `tls`, plaintext when None."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, tls.credentials(), options=[*options, *tls.options()])


def sync_channel(
    target: str, tls: ClientTLS | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A blocking grpc channel to `target`: TLS with `tls`, plaintext when None."""
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.credentials(), options=[*options, *tls.options()])

"""A real nginx in front of a gRPC server, for tests: its own config, pid, logs and temp
paths in a folder, in the foreground as one process (`daemon off`, `master_process off`),
on a free port of 127.0.0.1.

Debian's nginx (`nginx` / `nginx-light`, which `make test` installs when missing) has the
grpc and http_v2 modules built in. With `tls`, nginx terminates the caller's mutual TLS with
its own pair and the CA, and dials the upstream again over mutual TLS with the identity it
is given (`grpc_ssl_certificate`): the upstream sees the proxy's certificate, not the
caller's."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
START_S = 10.0


@dataclass(frozen=True)
class ProxyTLS:
    """The files nginx serves and dials with."""

    ca: Path
    """The CA callers' and the upstream's certificates are checked against."""
    cert: Path
    key: Path
    """nginx's server pair, shown to callers."""
    upstream_cert: Path
    upstream_key: Path
    """The identity nginx presents to the upstream."""
    upstream_name: str = "localhost"
    """The name the upstream's certificate is checked against."""


@dataclass(frozen=True)
class Route:
    """One listener: a port in front of the upstream with its own read timeout."""

    port: int
    read_timeout_s: int


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(folder: Path, upstream: str, routes: list[Route], tls: ProxyTLS | None) -> str:
    """nginx.conf for `routes` to the gRPC server at `upstream` (HOST:PORT)."""
    servers = []
    for route in routes:
        if tls is None:
            listen = f"listen 127.0.0.1:{route.port} http2;"
            edge = ""
            target = f"grpc://{upstream}"
            dial = ""
        else:
            listen = f"listen 127.0.0.1:{route.port} ssl http2;"
            edge = f"""
      ssl_certificate {tls.cert};
      ssl_certificate_key {tls.key};
      ssl_client_certificate {tls.ca};
      ssl_verify_client on;"""
            target = f"grpcs://{upstream}"
            dial = f"""
        grpc_ssl_certificate {tls.upstream_cert};
        grpc_ssl_certificate_key {tls.upstream_key};
        grpc_ssl_trusted_certificate {tls.ca};
        grpc_ssl_verify on;
        grpc_ssl_name {tls.upstream_name};
        grpc_ssl_server_name on;"""
        servers.append(
            f"""
    server {{
      {listen}{edge}
      location / {{
        grpc_pass {target};
        grpc_read_timeout {route.read_timeout_s}s;
        grpc_send_timeout {route.read_timeout_s}s;{dial}
      }}
    }}"""
        )
    return f"""
daemon off;
master_process off;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/client_body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    client_max_body_size 8m;
{"".join(servers)}
}}
"""


@contextlib.contextmanager
def running_nginx(
    folder: Path, upstream: str, read_timeouts_s: list[int], tls: ProxyTLS | None = None
) -> Iterator[list[Route]]:
    """nginx in front of `upstream`, one listener per read timeout; stopped after.

    Raises:
        RuntimeError: nginx is not installed, or did not start (its error log is quoted).
    """
    if not Path(NGINX).exists():
        raise RuntimeError("nginx is not installed: `make test` installs nginx-light")
    folder.mkdir(parents=True, exist_ok=True)
    routes = [Route(free_port(), t) for t in read_timeouts_s]
    conf = folder / "nginx.conf"
    conf.write_text(config(folder, upstream, routes, tls))
    log = folder / "error.log"
    proc = subprocess.Popen(
        [NGINX, "-p", str(folder), "-e", str(log), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(proc, routes, log)
        yield routes
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], routes: list[Route], log: Path) -> None:
    deadline = time.monotonic() + START_S
    pending = {r.port for r in routes}
    while pending:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            text = log.read_text() if log.exists() else ""
            raise RuntimeError(f"nginx exited {proc.returncode}: {err or text}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not listen within {START_S:.0f} s")
        for port in list(pending):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    pending.discard(port)
        time.sleep(0.05)

"""What the planner may fetch: which hosts, which local folders, where redirects may go, and
the one error every network failure reads as.

A planner reads model headers for anyone who may call it, so without a policy it is a way to
probe the network it sits in (the ports of other hosts, local files). The policy allows:

- the Hub endpoint (`HF_ENDPOINT`, else https://huggingface.co): exactly its origin;
- listed hosts (`--allow-host`, `LLMGW_PLANNER_ALLOW_HOSTS`, comma-separated): `HOST` (the
  scheme's default port), `HOST:PORT`, `HOST:*` (any port), `*.DOMAIN` (any name under it, as
  `*.DOMAIN:PORT` too). With none listed: huggingface.co and its CDNs (`*.huggingface.co`,
  `*.hf.co`), where Hub GGUF links and their redirects go;
- local roots (`--allow-root`, `LLMGW_PLANNER_ALLOW_ROOTS`, separated by ':'): `.gguf` files
  whose real path (symlinks resolved) is under one. None by default: the planner reads no
  local file unless told where.

Redirects are followed only to URLs the policy allows (`check_redirect`), never from https
down to http. Every transport failure (refused, reset, timed out, not HTTP) is the same
`SourceUnreachable` (`network_failure`), so an error tells nothing about a port a caller could
not otherwise see. Pure: the environment comes in as a mapping, paths are resolved by the
caller.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urljoin, urlsplit

from llmgw.sources import (
    ENV_HF_MIRRORS,
    SourceRefused,
    UrlSource,
    parse_url,
    path_is_under,
    redacted,
)
from planner_svc.domain.errors import SourceUnreachable

DEFAULT_HUB = "https://huggingface.co"
DEFAULT_HOSTS = ("huggingface.co", "*.huggingface.co", "*.hf.co")
"""The Hub and the CDNs its resolve/ links redirect to (cdn-lfs.huggingface.co,
cas-bridge.xethub.hf.co, ...)."""
ENV_HOSTS = "LLMGW_PLANNER_ALLOW_HOSTS"
ENV_ROOTS = "LLMGW_PLANNER_ALLOW_ROOTS"
ANY_PORT = -1


@dataclass
class SourceNotAllowed(SourceRefused, SourceUnreachable):
    """A source (or a redirect) the planner's policy does not allow.

    A refusal of the request's field (INVALID_ARGUMENT, reason SOURCE_NOT_ALLOWED: the status
    table matches InvalidValue first) where the source is the question (DescribeModel), and a
    source the planner cannot read where sizing goes ahead without it (SizeContext, PlanGPUs
    note that memory was not checked, as for an unreachable one: a local path may name a file
    on the GPU nodes that the planner has no business reading).
    """

    reason: str = "SOURCE_NOT_ALLOWED"
    field: str = "model.source"


@dataclass(frozen=True)
class HostRule:
    """One allowed host: a name (or `*.domain`) and a port (ANY_PORT for any, None for the
    scheme's default)."""

    host: str
    port: int | None = None

    def allows(self, url: UrlSource) -> bool:
        """Whether `url`'s host and port fall under this rule."""
        if self.host.startswith("*."):
            if not url.host.endswith(self.host[1:]):
                return False
        elif url.host != self.host:
            return False
        if self.port == ANY_PORT:
            return True
        if self.port is None:
            return url.port == (443 if url.scheme == "https" else 80)
        return url.port == self.port

    def __str__(self) -> str:
        port = "" if self.port is None else ":*" if self.port == ANY_PORT else f":{self.port}"
        return f"{self.host}{port}"


def parse_host_rule(text: str) -> HostRule:
    """`HOST`, `HOST:PORT`, `HOST:*`, `*.DOMAIN[:PORT]`, `[V6]:PORT`, or a URL's origin.

    Raises:
        ValueError: empty, a bad port, or a wildcard that is not `*.DOMAIN`.
    """
    entry = text.strip().lower()
    if "://" in entry:
        url = parse_url(entry)
        return HostRule(url.host, url.port)
    if not entry:
        raise ValueError("an allowed host cannot be empty")
    host, port_text = entry, ""
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"{text!r}: an IPv6 host is written [ADDRESS]:PORT")
        host, port_text = entry[1:close], entry[close + 1 :].removeprefix(":")
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    port: int | None = None
    if port_text == "*":
        port = ANY_PORT
    elif port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{text!r}: the port must be 1-65535 or '*'")
        port = int(port_text)
    if "*" in host and (not host.startswith("*.") or "*" in host[2:] or len(host) < 3):
        raise ValueError(f"{text!r}: a wildcard host is written *.DOMAIN")
    return HostRule(host, port)


ENV_MIRRORS = ENV_HF_MIRRORS
_ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def hub_mirrors(text: str) -> dict[str, str]:
    """`ORG=URL,...` as organisation -> endpoint.

    Raises:
        ValueError: an entry that is not ORG=http(s)://HOST[:PORT][/PATH].
    """
    mirrors: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        org, sep, url = entry.partition("=")
        if not sep or not _ORG.match(org) or not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"{ENV_MIRRORS}: {entry!r} is not ORG=http(s)://HOST[:PORT]")
        mirrors[org] = url.rstrip("/")
    return mirrors


@dataclass(frozen=True)
class SourcePolicy:
    """The hosts and local folders a planner may read sources from."""

    hosts: tuple[HostRule, ...] = ()
    roots: tuple[str, ...] = ()
    hub: str = DEFAULT_HUB
    extra: tuple[HostRule, ...] = field(default=(), repr=False)

    @classmethod
    def from_settings(
        cls,
        *,
        allow_hosts: Iterable[str] = (),
        allow_roots: Iterable[str] = (),
        hub_endpoint: str | None = None,
    ) -> SourcePolicy:
        """A policy from its settings: hosts (DEFAULT_HOSTS when none), real root paths, the
        Hub endpoint (DEFAULT_HUB when None). Raises ValueError for a bad host or root."""
        hub = (hub_endpoint or DEFAULT_HUB).rstrip("/")
        hub_url = parse_url(hub)
        listed = [parse_host_rule(h) for h in allow_hosts if h.strip()]
        rules = listed or [parse_host_rule(h) for h in DEFAULT_HOSTS]
        roots = []
        for root in allow_roots:
            if not root:
                continue
            if not root.startswith("/"):
                raise ValueError(f"allowed root {root!r} must be an absolute path")
            roots.append(posixpath.normpath(root))
        return cls(
            hosts=tuple(rules),
            roots=tuple(roots),
            hub=hub,
            extra=()
            if any(rule.allows(hub_url) for rule in rules)
            else (HostRule(hub_url.host, hub_url.port),),
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        allow_hosts: Sequence[str] = (),
        allow_roots: Sequence[str] = (),
    ) -> SourcePolicy:
        """The planner's policy: flags' hosts and roots, else those of LLMGW_PLANNER_ALLOW_HOSTS
        (comma-separated) and LLMGW_PLANNER_ALLOW_ROOTS (':'-separated); the Hub endpoint of
        HF_ENDPOINT and the mirrors of LLMGW_HF_MIRRORS. Roots should be real paths already
        (the caller resolves symlinks).

        Raises:
            ValueError: a bad host, root or mirror."""
        hosts = list(allow_hosts) or environ.get(ENV_HOSTS, "").split(",")
        roots = list(allow_roots) or environ.get(ENV_ROOTS, "").split(":")
        policy = cls.from_settings(
            allow_hosts=[h for h in hosts if h.strip()],
            allow_roots=[r for r in roots if r],
            hub_endpoint=environ.get("HF_ENDPOINT") or None,
        )
        # A Hub mirror's origin is allowed as the Hub's own is (sources/hf_hub.py).
        mirrors = [parse_url(url) for url in hub_mirrors(environ.get(ENV_MIRRORS, "")).values()]
        extra = [HostRule(m.host, m.port) for m in mirrors if not policy.allows_url(m)]
        return replace(policy, extra=(*policy.extra, *extra))

    def allows_url(self, url: UrlSource) -> bool:
        """Whether an http(s) URL's origin is allowed."""
        return any(rule.allows(url) for rule in (*self.extra, *self.hosts))

    def check_url(self, text: str, *, field: str = "model.source") -> UrlSource:
        """`text` parsed, when the policy allows its origin.

        Raises:
            SourceNotAllowed: not a valid http(s) URL, or its origin is not allowed.
        """
        try:
            url = parse_url(text, field=field)
        except SourceRefused as exc:
            raise SourceNotAllowed(exc.message, source=exc.source, field=field) from None
        if not self.allows_url(url):
            raise SourceNotAllowed(
                f"source {redacted(text)[:200]!r} is refused: the planner may fetch from "
                f"{self.describe_hosts()} only (allow more with --allow-host or {ENV_HOSTS})",
                source=redacted(text)[:200],
                field=field,
            )
        return url

    def check_redirect(self, from_url: str, to_url: str) -> str:
        """The absolute URL a redirect from `from_url` to `to_url` (a Location, maybe relative)
        leads to, when the policy allows it: its origin allowed, and never from https to http.

        Raises:
            SourceNotAllowed: the target is not allowed.
        """
        target = urljoin(from_url, to_url)
        if urlsplit(from_url).scheme.lower() == "https" and urlsplit(target).scheme != "https":
            raise SourceNotAllowed(
                f"{from_url[:200]} redirected to {target[:200]}, from https to plain http; "
                "the planner does not follow that",
                source=from_url[:200],
            )
        try:
            return self.check_url(target).url
        except SourceNotAllowed as exc:
            raise SourceNotAllowed(
                f"{from_url[:200]} redirected to {target[:200]}, which is refused: "
                f"{exc.message.split(': ', 1)[-1]}",
                source=from_url[:200],
            ) from None

    def check_path(self, real_path: str, given: str, *, field: str = "model.source") -> str:
        """`real_path` (the given path with symlinks resolved) when it is a `.gguf` file under
        an allowed root. Checked before the file is touched, so a refusal says nothing about
        whether it exists.

        Raises:
            SourceNotAllowed: no roots, outside them, or not a .gguf file.
        """
        if not self.roots:
            raise SourceNotAllowed(
                f"source {given[:200]!r} is refused: this planner reads no local files (allow a "
                f"folder with --allow-root or {ENV_ROOTS})",
                source=given[:200],
                field=field,
            )
        if (
            not real_path.startswith("/")
            or not real_path.lower().endswith(".gguf")
            or not path_is_under(posixpath.normpath(real_path), self.roots)
        ):
            raise SourceNotAllowed(
                f"source {given[:200]!r} is refused: local sources must be .gguf files under "
                f"{', '.join(self.roots[:5])}",
                source=given[:200],
                field=field,
            )
        return real_path

    def describe_hosts(self) -> str:
        """The allowed origins, for messages."""
        return ", ".join(str(rule) for rule in (*self.extra, *self.hosts))


def network_failure(url: str) -> SourceUnreachable:
    """The one error of every transport failure fetching `url`: refused, reset, timed out or
    not HTTP all read the same (the time it took may still differ; see docs/security.md)."""
    return SourceUnreachable(
        message=f"{url[:200]} could not be fetched: no HTTP answer came back; check the URL "
        "and that its server is up.",
        source=url[:200],
    )

"""The grammar of a model `source`, as the fleet accepts it and the agent checks it again.

A source is one of:

- an `https://` or `http://` URL with a host (no user:password part);
- `hf://ORG/NAME` or `hf://ORG/NAME@REVISION`, REVISION a branch, tag or commit;
- an absolute path, accepted only where the caller allows paths (the agent, under the roots
  its config names).

Never anything that starts with `-` (it would read as a flag on an engine's command line),
no control characters (NUL, newlines) and at most `MAX_SOURCE_CHARS` characters. Pure: no
I/O; whether a path's real location (after symlinks) is under a root is for the caller to
establish with the file system, then check with `check_path_under`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from llmgw.model import InvalidValue
from llmgw.text import first_unsafe

MAX_SOURCE_CHARS = 2048
"""Longer than any real URL a Hub or file server hands out (browsers keep ~2k working)."""
MAX_REVISION_CHARS = 255
"""A git ref component is limited by file names (255 bytes); a commit is 40 or 64 hex."""

# Hugging Face repo ids: letters, digits, '-', '_', '.', at most 96 characters per part, no
# '--' or '..' (huggingface_hub's validate_repo_id).
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# A revision: git's check-ref-format, narrowed to the characters branch and tag names use
# (no '%', so no encoded '..' either); '/' separates components; commits are hex.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

ACCEPTED = "an https:// or http:// URL, hf://ORG/NAME[@REVISION]"

ENV_HF_MIRRORS = "LLMGW_HF_MIRRORS"
"""`ORG=URL[,ORG=URL...]`: the Hub endpoint each organisation's hf:// repos are read from by
the planner (planner_svc/sources/policy.py), other repos coming from HF_ENDPOINT or the Hub."""

# Query parameters that carry credentials: exact names (lower-cased) and words in a name.
# From what signed-URL and token schemes use: AWS SigV4 (X-Amz-Signature, -Credential,
# -Security-Token), GCS (X-Goog-Signature, -Credential), Azure SAS (sig), bearer-in-query
# (access_token, RFC 6750 section 2.3), and the Hub's own hf_ tokens.
_SECRET_PARAMS = frozenset(
    [
        "token",
        "access_token",
        "auth",
        "authorization",
        "api_key",
        "apikey",
        "key",
        "sig",
        "signature",
        "secret",
        "password",
        "passwd",
        "pwd",
        "credential",
        "credentials",
        "session",
        "jwt",
        "bearer",
    ]
)
_SECRET_WORDS = ("token", "secret", "password", "signature", "credential", "apikey", "api_key")
CREDENTIALS_POINTER = (
    "credentials never go in a model's source (any viewer reads it, and it reaches logs and "
    "the engine's command line): give the planner and each agent their own HF_TOKEN "
    '(docs/security.md, "Model sources")'
)


@dataclass
class SourceRefused(InvalidValue):
    """A model source that is not of an accepted form; the message says why."""

    source: str = ""
    field: str = "source"
    reason: str = "INVALID_SOURCE"

    def metadata(self) -> dict[str, str]:
        return {"source": self.source} if self.source else {}


@dataclass(frozen=True)
class UrlSource:
    """An http(s) URL; `host` lowercased, `port` the URL's or the scheme's default."""

    url: str
    scheme: str
    host: str
    port: int
    path: str


@dataclass(frozen=True)
class HubSource:
    """`hf://ORG/NAME[@REVISION]`."""

    repo: str
    revision: str | None


@dataclass(frozen=True)
class PathSource:
    """An absolute path, normalized (no `.`/`..` segments, no `//` runs)."""

    path: str


Source = UrlSource | HubSource | PathSource


def _secret_param(name: str, value: str) -> bool:
    lowered = name.lower()
    return (
        lowered in _SECRET_PARAMS
        or any(word in lowered for word in _SECRET_WORDS)
        or value.startswith("hf_")
    )


def redacted(text: str) -> str:
    """`text` with what may be credentials hidden: a URL's user name and password, and the
    values of query parameters that carry secrets, each as `***`. Text that is no URL is
    given back as it is. For every message and log line that quotes a source."""
    if "://" not in text or text.lower().startswith("hf://"):
        return text
    try:
        split = urlsplit(text)
        netloc = split.netloc
    except ValueError:
        return text.split("?", 1)[0].rsplit("@", 1)[-1]
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = split.query
    if query:
        parts = []
        for item in query.split("&"):
            name, eq, value = item.partition("=")
            parts.append(f"{name}=***" if eq and _secret_param(name, value) else item)
        query = "&".join(parts)
    return urlunsplit((split.scheme, netloc, split.path, query, split.fragment))


def _shown(text: str) -> str:
    """`text` as a message may quote it: credentials hidden, cut, control characters escaped
    by repr."""
    text = redacted(text)
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _refuse(text: str, why: str, field: str = "source") -> SourceRefused:
    return SourceRefused(
        f"source {_shown(text)} is refused: {why}", source=redacted(text)[:200], field=field
    )


def revision_problem(revision: str) -> str:
    """Why `revision` cannot be a branch, tag or commit of a Hub repo; "" when it can.

    Refused: empty, over MAX_REVISION_CHARS, a leading `-` or non-alphanumeric, any `..`,
    `//` runs, a trailing `/` or `.`, a component starting with `.`, `.lock` endings, and any
    character but letters, digits, `.`, `_`, `-` and `/` (git check-ref-format's rules, which
    a Hub revision obeys, narrowed). A revision is joined into cache paths and URLs, so one
    that climbs (`main/../../x`) must never pass.
    """
    if not revision:
        return "the revision after '@' is empty"
    if len(revision) > MAX_REVISION_CHARS:
        return f"the revision is longer than {MAX_REVISION_CHARS} characters"
    if revision.startswith("-"):
        return "a revision cannot start with '-'"
    if ".." in revision:
        return "a revision cannot contain '..'"
    if not _REVISION.fullmatch(revision):
        return (
            "a revision is a branch, tag or commit: letters, digits, '.', '_', '-' and '/', "
            "starting with a letter or digit"
        )
    if "//" in revision or revision.endswith(("/", ".")):
        return "a revision cannot hold '//' or end with '/' or '.'"
    if any(part.startswith(".") or part.endswith(".lock") for part in revision.split("/")):
        return "no part of a revision may start with '.' or end with '.lock'"
    return ""


def check_revision(revision: str, *, field: str = "source") -> str:
    """`revision` when `revision_problem` finds none; SourceRefused saying which otherwise."""
    why = revision_problem(revision)
    if why:
        raise _refuse(f"@{revision}", why, field)
    return revision


def parse_hub(text: str, *, field: str = "source") -> HubSource:
    """`hf://ORG/NAME[@REVISION]` split and checked; SourceRefused when it is not that."""
    rest = text.removeprefix("hf://")
    name, at, revision = rest.partition("@")
    parts = name.split("/")
    if (
        len(parts) != 2
        or not all(_REPO_PART.fullmatch(part) for part in parts)
        or any(".." in part or "--" in part for part in parts)
    ):
        raise _refuse(
            text,
            "a Hugging Face repo is hf://ORG/NAME (letters, digits, '.', '_', '-'; no '..' or "
            "'--'), with @REVISION after it if pinned",
            field,
        )
    why = revision_problem(revision) if at else ""
    if why:
        raise _refuse(text, why, field)
    return HubSource(repo=name, revision=revision if at else None)


def parse_url(text: str, *, field: str = "source") -> UrlSource:
    """An http(s) URL with a host; SourceRefused for credentials in it, a bad port, no host."""
    if "\\" in text or " " in text:
        raise _refuse(text, "a URL cannot hold spaces or backslashes (percent-encode them)", field)
    try:
        split = urlsplit(text)
        port = split.port
    except ValueError as exc:
        raise _refuse(text, f"it is not a valid URL ({exc})", field) from None
    scheme = split.scheme.lower()
    if scheme not in ("http", "https"):
        raise _refuse(text, f"the URL must be https:// or http://, not {scheme}://", field)
    if split.username is not None or split.password is not None:
        raise _refuse(
            text, f"a URL cannot carry a user name or password: {CREDENTIALS_POINTER}", field
        )
    secrets = [
        name
        for name, value in parse_qsl(split.query, keep_blank_values=True)
        if _secret_param(name, value)
    ]
    if secrets:
        raise _refuse(
            text,
            f"its query parameter {secrets[0][:40]!r} carries a credential: {CREDENTIALS_POINTER}",
            field,
        )
    host = (split.hostname or "").lower()
    if not host:
        raise _refuse(text, "the URL has no host", field)
    if port == 0:
        raise _refuse(text, "port 0 is not a port a server listens on", field)
    return UrlSource(
        url=text,
        scheme=scheme,
        host=host,
        port=port or (443 if scheme == "https" else 80),
        path=split.path or "/",
    )


def normalize_path(text: str, *, field: str = "source") -> str:
    """An absolute path with no `.`/`..` segments or `//` runs, as given (refused otherwise:
    a path that needs normalizing is one a person did not mean, or one that climbs)."""
    if not text.startswith("/"):
        raise _refuse(
            text,
            "a path must be absolute (it would be read relative to a server's folder)",
            field,
        )
    if "//" in text or any(part in (".", "..") for part in text.split("/")):
        raise _refuse(text, "a path cannot hold '.' or '..' segments or '//' runs", field)
    if text != "/" and text.endswith("/"):
        raise _refuse(text, "a path names a file, not a folder ending in '/'", field)
    return posixpath.normpath(text)


def parse_source(text: object, *, allow_paths: bool = False, field: str = "source") -> Source:
    """A source parsed by its grammar.

    Args:
        text: what was given (anything: only text can pass).
        allow_paths: whether an absolute path is a source here (the agent: yes, under its
            roots; the fleet: a path is what the agent on a node will read).
        field: the request field named in a refusal.

    Raises:
        SourceRefused: not text, empty, too long, control characters, a leading `-` or
            whitespace, or of no accepted form; the message says which.
    """
    if not isinstance(text, str):
        raise SourceRefused("a source must be text", field=field)
    if not text:
        raise SourceRefused("a source is required: " + _accepted(allow_paths), field=field)
    if len(text) > MAX_SOURCE_CHARS:
        raise _refuse(text, f"it is longer than {MAX_SOURCE_CHARS} characters", field)
    if _CONTROL.search(text) or first_unsafe(text) >= 0:
        raise _refuse(
            text,
            "it holds control characters (NUL, newline, tab, ESC, C1, direction overrides, ...)",
            field,
        )
    if text != text.strip():
        raise _refuse(text, "it starts or ends with whitespace", field)
    if text.startswith("-"):
        raise _refuse(
            text, "a source cannot start with '-' (an engine would read it as a flag)", field
        )
    lowered = text.lower()
    if lowered.startswith("hf://"):
        return parse_hub(text, field=field)
    if lowered.startswith(("http://", "https://")):
        return parse_url(text, field=field)
    if "://" in text or lowered.startswith("file:"):
        raise _refuse(text, _accepted(allow_paths), field)
    if allow_paths and text.startswith("/"):
        return PathSource(normalize_path(text, field=field))
    raise _refuse(text, _accepted(allow_paths), field)


def _accepted(allow_paths: bool) -> str:
    return f"give {ACCEPTED}" + (" or an absolute path" if allow_paths else "")


def path_is_under(path: str, roots: Sequence[str]) -> bool:
    """Whether normalized absolute `path` is inside one of `roots` (lexically: resolve symlinks
    on both before asking). A root is never matched by a sibling that shares its prefix
    (`/models2` is not under `/models`)."""
    for root in roots:
        base = posixpath.normpath(root)
        if base == "/" or path == base or path.startswith(base.rstrip("/") + "/"):
            return True
    return False


def check_path_under(path: str, roots: Sequence[str], *, field: str = "source") -> str:
    """`path` (absolute, normalized, symlinks already resolved by the caller) when it is under
    one of `roots`.

    Raises:
        SourceRefused: no roots allow paths, or the path is outside all of them.
    """
    normalized = normalize_path(path, field=field)
    if not roots:
        raise _refuse(path, "local paths are not allowed here (no roots are configured)", field)
    if not path_is_under(normalized, roots):
        shown = ", ".join(roots[:5])
        raise _refuse(path, f"it is outside the folders allowed ({shown})", field)
    return normalized

"""The files access rests on, read again when they change: the tokens file, and the roles in
the cluster settings. Either one failing to parse fails closed for what it governs: no token
accepted, or every call but health and reflection refused, saying which line."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog
import yaml

from llmgw import strict
from llmgw.authz.policy import DEFAULT_ROLES, InvalidRoles, Policy, Roles, Tokens, parse_roles
from llmgw.identity import IdentityError, check_name
from llmgw.refusal import Refusal

log = structlog.get_logger(__name__)

SETTINGS_KEYS = ("roles", "models")
"""The cluster settings file's top-level keys (the fleet reads `models:` too)."""


def read_settings_roles(path: str | Path | None, defaults: Roles = DEFAULT_ROLES) -> Roles:
    """The roles a cluster settings file gives (its `roles:`), `defaults` when there is no
    file or no such section: what a service that reads no models (the planner) takes.

    Raises:
        InvalidRoles: the file cannot be read, is not a mapping of the settings' keys, or its
            `roles:` is malformed.
    """
    if not path:
        return defaults
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRoles(
            f"cannot read the settings file {path}: {exc}", field="settings"
        ) from exc
    if not isinstance(data, dict):
        raise InvalidRoles(f"{path}: the settings file holds a mapping", field="settings")
    unknown = strict.unknown_keys(data, SETTINGS_KEYS)
    if unknown:
        raise InvalidRoles(f"{path}: {'; '.join(unknown)}", field="settings")
    if "roles" not in data:
        return defaults
    try:
        return parse_roles(data["roles"] or {}, source=str(path))
    except InvalidRoles as exc:
        raise InvalidRoles(f"{path}: {exc.message}", field=exc.field) from exc


# -- the tokens file -------------------------------------------------------------------------

_LINE = re.compile(r"^([^\s:]+)\s+([0-9A-Fa-f]{64})$")


def parse_tokens(text: str, where: str = "tokens") -> Tokens:
    """A tokens file: lines `NAME SHA256HEX` (`#` comments and blank lines skipped), or a YAML
    mapping `NAME: SHA256HEX`. Each NAME is a user (`spiffe://llmgw/user/NAME` by token).

    Raises:
        ValueError: a line or entry that is neither, a bad name or a bad hash; the message
            names the line.
    """
    numbered = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)]
    numbered = [(i, ln) for i, ln in numbered if ln and not ln.startswith("#")]
    pairs: list[tuple[int, str, str]] = []
    bad = [(i, ln) for i, ln in numbered if not _LINE.fullmatch(ln)]
    if not bad:
        for i, ln in numbered:
            m = _LINE.fullmatch(ln)
            assert m is not None
            pairs.append((i, m.group(1), m.group(2)))
    else:
        data: object = None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        if not isinstance(data, dict):
            line, _ = bad[0]
            raise ValueError(
                f"{where}, line {line}: not `NAME SHA256HEX` (and the file is no YAML map "
                "NAME: SHA256HEX)"
            )
        lines = {ln.split(":", 1)[0].strip(): i for i, ln in numbered}
        pairs = [(lines.get(str(k), 0), str(k), str(v)) for k, v in data.items()]
    for line, name, digest in pairs:
        try:
            check_name(name)
            Tokens.of([(name, digest)])
        except (IdentityError, ValueError) as exc:
            raise ValueError(f"{where}, line {line}: {exc}") from exc
    return Tokens.of([(name, digest) for _, name, digest in pairs])


class TokensFile:
    """A tokens file, read again when it changes (size or mtime), so revoking a token is
    deleting its line. A file that stops parsing fails closed: no token is accepted until it
    parses again, and the refusal names the line at fault."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.failure = ""
        self.tokens = self._load()

    def _load(self) -> Tokens:
        try:
            st = self.path.stat()
            text = self.path.read_text()
        except OSError as exc:
            raise ValueError(f"the tokens file {self.path} cannot be read: {exc.strerror}") from exc
        self._stamp = (st.st_mtime_ns, st.st_size)
        return parse_tokens(text, str(self.path))

    def current(self) -> Tokens:
        """The table, re-read if the file changed; empty while the file does not parse."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError as exc:
            stamp = None
            error = f"the tokens file {self.path} cannot be read: {exc.strerror}"
        if stamp is not None and stamp == self._stamp:
            return self.tokens
        try:
            if stamp is None:
                raise ValueError(error)
            self.tokens = self._load()
            self.failure = ""
            log.info("tokens_reloaded", path=str(self.path), users=len(self.tokens.hashes))
        except ValueError as exc:
            if not self.failure:
                log.error("tokens_reload_failed", path=str(self.path), error=str(exc))
            self.failure = str(exc)
            self.tokens = Tokens()
            self._stamp = stamp
        return self.tokens


class RolesFile:
    """The settings file's `roles:` (as `read` reads them), read again when the file changes
    (checked at most once every `RELOAD_CHECK_S`). A file that stops parsing fails closed: the
    policy carries the failure, and every call but health and reflection is refused until it
    parses again."""

    def __init__(
        self,
        path: Path,
        policy: Policy,
        clock: Callable[[], float],
        read: Callable[[Path], Roles],
    ) -> None:
        self.path = path
        self._read = read
        self.policy = policy
        self._clock = clock
        self._checked = clock()
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> Policy:
        """The policy, its roles re-read if the file changed."""
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return self.policy
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return self.policy
        self._stamp = stamp
        try:
            roles = self._read(self.path)
        except Refusal as exc:
            if not self.policy.failure:
                log.error("roles_reload_failed", path=str(self.path), error=exc.message)
            self.policy = replace(self.policy, failure=exc.message)
            return self.policy
        self.policy = replace(self.policy, roles=roles, failure="")
        log.info("roles_reloaded", path=str(self.path), roles=roles.summary())
        return self.policy


RELOAD_CHECK_S = 1.0
"""How often the roles file's stamp is looked at: a revocation takes effect within this."""

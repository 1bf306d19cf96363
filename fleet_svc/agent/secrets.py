"""Secret references in the agent's own config: an engine's environment variable given as
`{from_env: NAME}` (the agent's own environment) or `{from_file: /abs/path}` (a mounted
Secret), resolved by the agent each time it starts the engine, so a credential such as the
Hub's `HF_TOKEN` stays on the node: it never travels through the fleet, the catalog or a
model source, is never logged, and a rotated file is read at the next start."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_SECRET_BYTES = 64 << 10
"""The largest secret file read (a token is tens of bytes; a larger file is a wrong path)."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SecretError(ValueError):
    """A secret reference that cannot be parsed or resolved; the message names the variable
    and where its value was to come from, never a value."""


@dataclass(frozen=True)
class SecretRef:
    """Where one variable's value comes from: `kind` "env" (the agent's variable `where`)
    or "file" (the file at `where`)."""

    kind: str
    where: str

    def resolve(self, environ: Mapping[str, str] | None = None) -> str:
        """The value now.

        Raises:
            SecretError: the variable is unset or empty, or the file cannot be read, is too
                large, or is empty.
        """
        if self.kind == "env":
            value = (os.environ if environ is None else environ).get(self.where, "")
            if not value:
                raise SecretError(f"the agent's environment has no {self.where}")
            return value
        path = Path(self.where)
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise SecretError(f"{self.where} cannot be read: {exc.strerror}") from exc
        if len(data) > MAX_SECRET_BYTES:
            raise SecretError(f"{self.where} is larger than {MAX_SECRET_BYTES} bytes")
        value = data.decode("utf-8", errors="strict").strip() if data else ""
        if not value:
            raise SecretError(f"{self.where} is empty")
        return value


def parse_env_value(name: str, value: Any, where: str) -> str | SecretRef:
    """One `env:` entry of an engine: a literal (as before) or a secret reference.

    Raises:
        SecretError: a mapping that is not exactly one of `from_env: NAME`, `from_file:
            /ABSOLUTE/PATH`.
    """
    if not isinstance(value, Mapping):
        return str(value)
    if len(value) != 1 or not set(value) <= {"from_env", "from_file"}:
        raise SecretError(
            f"{where}: env.{name} is a value, or a mapping of exactly one of from_env: NAME "
            "(the agent's own variable) or from_file: /PATH (a mounted secret)"
        )
    ((kind, source),) = value.items()
    if not isinstance(source, str) or not source:
        raise SecretError(f"{where}: env.{name}.{kind} must be a name or a path")
    if kind == "from_env" and not _ENV_NAME.fullmatch(source):
        raise SecretError(f"{where}: env.{name}.from_env must be a variable name")
    if kind == "from_file" and not os.path.isabs(source):
        raise SecretError(f"{where}: env.{name}.from_file must be an absolute path")
    return SecretRef("env" if kind == "from_env" else "file", source)


def resolve_all(refs: Mapping[str, SecretRef]) -> dict[str, str]:
    """Every reference's value now.

    Raises:
        SecretError: naming the first variable that cannot be resolved, and why.
    """
    out = {}
    for name, ref in refs.items():
        try:
            out[name] = ref.resolve()
        except SecretError as exc:
            raise SecretError(f"the engine's {name} cannot be set: {exc}") from exc
    return out

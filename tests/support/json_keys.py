"""The one `--json` convention of the CLI: every key is a proto field name (snake_case)."""

from __future__ import annotations

import re
from typing import Any

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def camel_keys(data: Any, where: str = "$") -> list[str]:
    """The paths of every key in `data` (nested dicts and lists) that is not snake_case."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if not SNAKE.match(str(key)):
                found.append(f"{where}.{key}")
            found.extend(camel_keys(value, f"{where}.{key}"))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found.extend(camel_keys(value, f"{where}[{i}]"))
    return found

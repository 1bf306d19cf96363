"""Engine versions as a profile names them ("0.10.2", "v0.31.0", "0.9.1.dev705+g01220ce89",
"V0"), and version ranges to key an engine's memory rules by."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

_NUMBERS = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", re.IGNORECASE)

Version = tuple[int, int, int]


def parse_version(text: str) -> Version | None:
    """(major, minor, patch) of a version string; None when it names none (empty, "latest",
    "main"). Suffixes (".dev705+g…", "rc3", "-cu128") are ignored."""
    match = _NUMBERS.match(text or "")
    if match is None:
        return None
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    return (major, minor, patch)


@dataclass(frozen=True)
class Ranged:
    """Rules that hold from `since` (inclusive) up to `until` (exclusive; None: still)."""

    since: Version
    until: Version | None
    label: str

    def holds(self, version: Version) -> bool:
        """Whether `version` is in the range."""
        return self.since <= version and (self.until is None or version < self.until)


R = TypeVar("R", bound="Ranged")


def pick(rules: tuple[R, ...], text: str) -> tuple[R, str]:
    """The rules for a version string, and how the answer should name them: the range holding
    the version, or, when the version is not given or not in any range, the newest rules
    (the last), said so."""
    version = parse_version(text)
    if version is not None:
        for rule in rules:
            if rule.holds(version):
                return rule, f"{rule.label} (version {text.strip()})"
    newest = rules[-1]
    said = "no version named" if not (text or "").strip() else f"{text.strip()!r} not known"
    return newest, f"{newest.label} ({said}: the newest rules known)"


def in_a_range(rules: tuple[R, ...], text: str) -> bool:
    """Whether `text` names a version one of `rules`' ranges holds (False when it names
    none: `pick` then answers with the newest rules, and says so)."""
    version = parse_version(text)
    return version is not None and any(rule.holds(version) for rule in rules)

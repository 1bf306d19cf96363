"""Text a person will read: which characters can take over a terminal or hide what a line says,
the check that refuses them in what callers send, and the two ways of making text from others
safe to show (cleaned for storing, escaped for printing).

Unsafe are the C0 controls (U+0000-U+001F: ESC starts every terminal escape sequence, CR and
newline forge lines), DEL and the C1 controls (U+007F-U+009F: U+009B is a one-character CSI
on many terminals), the bidirectional overrides, embeddings and isolates (U+202A-U+202E,
U+2066-U+2069) and the invisible direction marks (U+200E, U+200F, U+061C), which reorder what
is shown against what is stored (CVE-2021-42574, "Trojan Source"), and the Unicode line and
paragraph separators (U+2028, U+2029). Pure: no I/O.
"""

from __future__ import annotations

import re

from llmgw.model import InvalidValue

_BIDI = frozenset(
    [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C, 0x2028, 0x2029]
)

MULTILINE_ALLOWED = frozenset("\n\t")
"""What a multi-line field (an engine argument holding an inline chat template) may hold of
the controls: newlines and tabs, which the printing side escapes."""


def is_unsafe(char: str) -> bool:
    """Whether one character is a control, a direction override or a line separator."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or code in _BIDI


_CLASS = "\x00-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\u2028\u2029"
_UNSAFE = re.compile(f"[{_CLASS}]")
# The same set less newline and tab (a character class subtraction, spelled out).
_UNSAFE_MULTILINE = re.compile(f"(?![\n\t])[{_CLASS}]")


def first_unsafe(text: str, *, allow: frozenset[str] = frozenset()) -> int:
    """The index of the first unsafe character of `text` not in `allow`; -1 when none. (A
    compiled pattern: this runs over every argument of every request.)"""
    if not allow:
        found = _UNSAFE.search(text)
    elif allow == MULTILINE_ALLOWED:
        found = _UNSAFE_MULTILINE.search(text)
    else:
        for i, char in enumerate(text):
            if char not in allow and is_unsafe(char):
                return i
        return -1
    return found.start() if found else -1


def check_text(text: str, field: str, *, multiline: bool = False) -> str:
    """`text`, refused when it holds an unsafe character (for `multiline` fields, newlines and
    tabs pass).

    Raises:
        InvalidValue: naming `field`, the character's code point and where it is.
    """
    at = first_unsafe(text, allow=MULTILINE_ALLOWED if multiline else frozenset())
    if at >= 0:
        raise InvalidValue(
            f"{field} holds the control character U+{ord(text[at]):04X} at position {at}: "
            "names and text a person reads cannot hold terminal controls, direction overrides "
            "or line breaks; remove it",
            field=field,
        )
    return text


def cleaned(text: str) -> str:
    """`text` with every unsafe character replaced by U+FFFD (for what others report that is
    kept, such as a node's card model: shown as received, never as controls)."""
    if first_unsafe(text) < 0:
        return text
    return "".join("\ufffd" if is_unsafe(c) else c for c in text)


def escaped(text: str, *, keep: frozenset[str] = frozenset()) -> str:
    """`text` with every unsafe character not in `keep` written as a visible escape (`\\x1b`,
    `\\n`, `\\u202e`), for printing what did not come from the printer itself."""
    if first_unsafe(text, allow=keep) < 0:
        return text
    out = []
    for char in text:
        if char in keep or not is_unsafe(char):
            out.append(char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) <= 0xFF:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)

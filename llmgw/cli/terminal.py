"""What `llmgw` writes to a terminal: everything it prints passes through an escaping stream, so
text that came from a service (names, arguments, a node's card model, a refusal's message)
can never carry terminal controls or direction overrides to the operator's screen.

The command's own text holds no such characters, only newlines and tabs, which pass; every
other control, C1 character, bidi override or line separator is written as a visible escape
(llmgw.text.escaped). Fields printed inside one line (a table cell, an argument list) are
escaped whole, newlines too, where they are formatted (`llmgw.cli.output.cell`).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

from llmgw.text import escaped

LAYOUT = frozenset("\n\t")
"""The controls the command's own layout uses."""


class EscapingStream(io.TextIOBase):
    """A text stream that writes `inner` everything it is given, unsafe characters escaped."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(escaped(text, keep=LAYOUT))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._inner, "encoding", "utf-8")


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Route sys.stdout and sys.stderr through EscapingStream for the body."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(out), EscapingStream(err)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err

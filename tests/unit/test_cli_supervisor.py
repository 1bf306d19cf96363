"""llmgw.cli.supervisor: children are ready when their log says where they listen, a child
that dies first is reported with its log's tail, and they are stopped in the order asked."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from llmgw.cli.supervisor import Child, StartFailed, Supervisor, wait_listening

# A child that says where it listens (after a JSON log line that mentions an address, which
# is not the announcement), then waits to be stopped.
LISTENS = (
    "import sys, time\n"
    'print(\'{"event": "listening on 10.0.0.1:1"}\', flush=True)\n'
    'print("demo listening on http://127.0.0.1:4242", flush=True)\n'
    "time.sleep(60)\n"
)
DIES = "import sys\nprint('no config here', flush=True)\nsys.exit(3)\n"


def test_a_child_is_ready_at_its_listening_line(tmp_path: Path) -> None:
    """The address comes from the plain `listening on` line, not from a JSON log line."""
    sup = Supervisor(tmp_path)
    child = sup.start("files", [sys.executable, "-c", LISTENS], {}, 5.0)
    try:
        assert wait_listening(child, 10, threading.Event()) == "127.0.0.1:4242"
        assert child.address == "127.0.0.1:4242"
        assert sup.exited() is None
    finally:
        sup.stop_all((), lambda _c, _code: None)
    assert child.log_path.read_text().startswith("--- llmgw up: ")


def test_a_child_that_exits_before_listening_is_reported_with_its_log(tmp_path: Path) -> None:
    """A child that exits first is a StartFailed naming its code and quoting its log."""
    child = Supervisor(tmp_path).start("planner", [sys.executable, "-c", DIES], {}, 5.0)
    with pytest.raises(StartFailed) as caught:
        wait_listening(child, 10, threading.Event())
    assert "the planner exited (code 3) before it listened" in str(caught.value)
    assert "no config here" in str(caught.value)


def test_children_stop_in_the_order_asked_then_the_rest(tmp_path: Path) -> None:
    """stop_all stops the named children in the given order, then any other, each once;
    SIGTERM ends a sleeping Python child with -15."""
    sup = Supervisor(tmp_path)
    for name in ("files", "planner", "extra", "fleet"):
        sup.start(name, [sys.executable, "-c", "import time; time.sleep(60)"], {}, 5.0)
    stopped: list[tuple[str, int | None]] = []

    def record(child: Child, code: int | None) -> None:
        stopped.append((child.name, code))

    sup.stop_all(("fleet", "planner", "files"), record)
    assert stopped == [("fleet", -15), ("planner", -15), ("files", -15), ("extra", -15)]
    assert all(not c.running() for c in sup.children)

"""Memory claims on stand-in cards: files a process writes so its card use can be observed.

A stand-in card has no driver to ask how much memory is in use, so each process that "uses" a
card writes `<cards_dir>/<index>/<pid>.json` holding the bytes it took. A card's use is the sum
of the claims whose process is alive; the claim of a process that is gone (exited, or killed
with SIGKILL before it could clean up) no longer counts and is removed when next read. That makes
"the card's memory was freed" observable exactly when the process is gone, as with a real card.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

# The environment variable through which the agent tells a stand-in engine where to claim.
CARDS_DIR_ENV = "LLMGW_STANDIN_CARDS_DIR"


def process_alive(pid: int) -> bool:
    """Whether a process with that pid exists and is not a zombie (a zombie holds no memory:
    it has exited and only waits for its parent to read its status)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is someone else's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): kill(0) is all we can tell
    # The state is the field after the parenthesised command name, which may hold spaces.
    state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
    return state not in ("Z", "X")


def claim(cards_dir: Path, index: int, pid: int, memory_bytes: int) -> Path:
    """Record that process `pid` uses `memory_bytes` of card `index`; returns the claim file.

    Written to a temporary name and renamed, so a reader never sees half a claim.
    """
    folder = cards_dir / str(index)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    tmp = folder / f".{pid}.json.tmp"
    tmp.write_text(json.dumps({"pid": pid, "bytes": int(memory_bytes)}))
    os.replace(tmp, path)
    return path


def release(cards_dir: Path, pid: int) -> int:
    """Remove every claim of process `pid` on every card; returns how many were removed."""
    removed = 0
    if not cards_dir.is_dir():
        return 0
    for folder in cards_dir.iterdir():
        path = folder / f"{pid}.json"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def used_bytes(cards_dir: Path, index: int) -> int:
    """The memory in use on card `index`: the sum of the claims of live processes.

    Claims of processes that are gone are deleted on the way (they can no longer be released
    by their owner), as are unreadable ones.
    """
    folder = cards_dir / str(index)
    if not folder.is_dir():
        return 0
    total = 0
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
            pid = int(data["pid"])
            memory = int(data["bytes"])
        except FileNotFoundError:
            continue  # released while we listed the folder
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if process_alive(pid):
            total += max(0, memory)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return total


def claimed_by(cards_dir: Path, pid: int) -> list[int]:
    """The card indices on which process `pid` holds a claim, ascending."""
    if not cards_dir.is_dir():
        return []
    found = []
    for folder in cards_dir.iterdir():
        if (folder / f"{pid}.json").exists() and folder.name.isdigit():
            found.append(int(folder.name))
    return sorted(found)

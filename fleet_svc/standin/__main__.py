"""Run the stand-in engine: `python -m fleet_svc.standin --port P [...]`."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from fleet_svc.agent import claims
from fleet_svc.standin.options import OptionsError, parse_options
from fleet_svc.standin.server import StandinServer, StandinState


def _say(level: str, message: str) -> None:
    # Lines like an engine's own log, flushed at once: the agent shows the last ones on a crash.
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [standin] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Start, "load", serve until SIGTERM (or fail as asked); the exit code."""
    env = dict(os.environ)
    try:
        opts = parse_options(sys.argv[1:] if argv is None else argv, env)
    except OptionsError as exc:
        _say("ERROR", str(exc))
        return 1
    cards_dir = Path(env[claims.CARDS_DIR_ENV]) if env.get(claims.CARDS_DIR_ENV) else None
    pid = os.getpid()
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        server = StandinServer(StandinState(opts))
    except OSError as exc:
        _say("ERROR", f"cannot listen on {opts.host}:{opts.port}: {exc}")
        return 1
    # Memory is taken while loading, as a real engine's weights are.
    if cards_dir is not None:
        for index in opts.gpus:
            claims.claim(cards_dir, index, pid, opts.memory_bytes)
    _say(
        "INFO",
        f"serving {opts.model} as {opts.engine} on {opts.host}:{opts.port}, "
        f"cards {list(opts.gpus)}, tp={opts.tensor_parallel}, context={opts.context_tokens}",
    )
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    try:
        if stop.wait(opts.load_s):
            return 0
        if opts.fail_on_start:
            _say("ERROR", f"RuntimeError: failed to load model {opts.model} (asked to fail)")
            return 1
        server.state.ready.set()
        _say("INFO", "model loaded; ready")
        if opts.fail_after_s is not None:
            if not stop.wait(opts.fail_after_s):
                _say("ERROR", f"RuntimeError: engine core died after {opts.fail_after_s:g} s")
                return 1
            return 0
        stop.wait()
        _say("INFO", "SIGTERM: shutting down")
        return 0
    finally:
        server.shutdown()
        server.server_close()
        if cards_dir is not None:
            with contextlib.suppress(OSError):
                claims.release(cards_dir, pid)


if __name__ == "__main__":
    sys.exit(main())

"""Run the stand-in engine: `python -m fleet_svc.standin --port P [...]`, or as llama.cpp's
RPC worker: `python -m fleet_svc.standin --rpc-server -H HOST -p PORT`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from fleet_svc.agent import claims
from fleet_svc.standin.gang import GangError, GangLink, parse_rpc_server, serve_rpc
from fleet_svc.standin.options import ARGV_DIR_ENV, OptionsError, parse_options
from fleet_svc.standin.server import StandinServer, StandinState


def _say(level: str, message: str) -> None:
    # Lines like an engine's own log, flushed at once: the agent shows the last ones on a crash.
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [standin] {message}", flush=True)


def _stop_event() -> threading.Event:
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return stop


def rpc_server(argv: list[str]) -> int:
    """Stand in for llama.cpp's `rpc-server -H HOST -p PORT` until SIGTERM."""
    try:
        host, port = parse_rpc_server(argv)
    except GangError as exc:
        _say("ERROR", str(exc))
        return 1
    stop = _stop_event()
    _say("INFO", f"Starting RPC server on {host}:{port}")
    why = serve_rpc(host, port, stop)
    if why:
        _say("ERROR", why)
        return 1
    return 0


def _formed(gang: GangLink | None, stop: threading.Event) -> str | None:
    """Wait until the gang met: None when it did (or there is none), "" on a stop, else why
    it could not."""
    if gang is None:
        return None
    while not (gang.formed.is_set() or gang.broken.is_set() or stop.is_set()):
        gang.formed.wait(0.05)
    if gang.broken.is_set():
        return gang.why
    return "" if stop.is_set() else None


def record_argv(folder: Path, name: str, argv: list[str]) -> None:
    """Write the command line as a JSON list to `folder/name.json` (a test's record of what
    the agent started); a name that is not a plain file name is not written."""
    if not name or "/" in name or name.startswith("."):
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(argv))
    os.replace(tmp, folder / f"{name}.json")


def main(argv: list[str] | None = None) -> int:
    """Start, "load", serve until SIGTERM (or fail as asked); the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--rpc-server"]:
        return rpc_server(args[1:])
    env = dict(os.environ)
    if env.get(ARGV_DIR_ENV):
        record_argv(Path(env[ARGV_DIR_ENV]), env.get("LLMGW_REPLICA_ID") or str(os.getpid()), args)
    try:
        opts = parse_options(args, env)
    except OptionsError as exc:
        _say("ERROR", str(exc))
        return 1
    cards_dir = Path(env[claims.CARDS_DIR_ENV]) if env.get(claims.CARDS_DIR_ENV) else None
    pid = os.getpid()
    stop = _stop_event()
    role = opts.gang
    server: StandinServer | None = None
    state = StandinState(opts)
    if role is None or role.serves_http:
        try:
            server = StandinServer(state)
        except OSError as exc:
            _say("ERROR", f"cannot listen on {opts.host}:{opts.port}: {exc}")
            return 1
    # Memory is taken while loading, as a real engine's weights are.
    if cards_dir is not None:
        for index in opts.gpus:
            claims.claim(cards_dir, index, pid, opts.memory_bytes)
    where = "" if role is None else f", rank {role.rank} of {role.nnodes} nodes"
    _say(
        "INFO",
        f"serving {opts.model} as {opts.engine} on {opts.host}:{opts.port}, "
        f"cards {list(opts.gpus)}, tp={opts.tensor_parallel}, context={opts.context_tokens}"
        + where
        + ("" if server else " (headless: no HTTP)"),
    )
    gang = GangLink(role) if role is not None else None
    if gang is not None:
        # A head listens where its members are told to meet it (vLLM's master address,
        # SGLang's dist-init host); --host is only where it serves HTTP.
        gang.start(gang.role.rendezvous[0] or opts.host)
    if server is not None:
        threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    try:
        if stop.wait(opts.load_s):
            return 0
        if opts.fail_on_start:
            _say("ERROR", f"RuntimeError: failed to load model {opts.model} (asked to fail)")
            return 1
        why = _formed(gang, stop)
        if why == "":
            return 0
        if why is not None:
            _say("ERROR", f"RuntimeError: {why}")
            return 1
        state.ready.set()
        _say("INFO", "model loaded; ready" + ("; every node joined" if gang else ""))
        deadline = None if opts.fail_after_s is None else time.monotonic() + opts.fail_after_s
        while not stop.is_set():
            if gang is not None and gang.broken.is_set():
                _say("ERROR", f"RuntimeError: {gang.why}")
                return 1
            if deadline is not None and time.monotonic() >= deadline:
                _say("ERROR", f"RuntimeError: engine core died after {opts.fail_after_s:g} s")
                return 1
            stop.wait(0.05)
        _say("INFO", "SIGTERM: shutting down")
        return 0
    finally:
        if gang is not None:
            gang.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        if cards_dir is not None:
            with contextlib.suppress(OSError):
                claims.release(cards_dir, pid)


if __name__ == "__main__":
    sys.exit(main())

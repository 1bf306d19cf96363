"""Serve the demo's files: `python -m llmgw.demo --listen HOST:PORT --folder DIR`.

Writes the tiny GGUF model into the folder when it is not there, then serves the folder under
/files/ and the demo's Hugging Face repo as the Hub (point HF_ENDPOINT at it) until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import structlog

from llmgw.cmdline import UsageParser, add_log_format_argument, add_version, log_format
from llmgw.demo.catalog import GGUF_FILE
from llmgw.demo.files import DemoFileServer
from llmgw.demo.hf_repo import REPO, demo_repo
from llmgw.demo.tiny_gguf import write_tiny_gguf
from llmgw.logs import configure_logging


def build_parser() -> UsageParser:
    """The demo file server's command line."""
    parser = UsageParser(
        prog="python -m llmgw.demo",
        description="Serve the demo's files (`llmgw up` starts it): the tiny GGUF model "
        "under /files/ and the demo's Hugging Face repo as the Hub (point HF_ENDPOINT at it).",
        epilog="example:\n  python -m llmgw.demo --listen 127.0.0.1:0 --folder /tmp/models",
    )
    add_version(parser)
    parser.add_argument(
        "--listen", default="127.0.0.1:50053", help="HOST:PORT to listen on; port 0 picks one"
    )
    parser.add_argument(
        "--folder",
        type=Path,
        default=Path("data/models"),
        help="the folder of files to serve (the tiny model is written there when missing)",
    )
    add_log_format_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags, write the model file if missing, serve until signalled."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    configure_logging(log_format(opts) == "json")
    log = structlog.get_logger("llmgw.demo")
    host, _, port_text = opts.listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        parser.error(f"--listen {opts.listen!r}: write HOST:PORT")
    model = opts.folder / GGUF_FILE
    if not model.is_file():
        write_tiny_gguf(model)
        log.info("model_file_written", path=str(model))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server = DemoFileServer(
            opts.folder, {REPO: demo_repo()}, host=host or "127.0.0.1", port=port
        )
        server.start()
    except OSError as exc:
        print(f"demo files: cannot listen on {opts.listen}: {exc}", file=sys.stderr)
        return 1
    print(f"demo files listening on {server.url}", flush=True)
    log.info("file_server_started", url=server.url, folder=str(opts.folder), repo=REPO)
    stop.wait()
    server.stop()
    log.info("file_server_stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

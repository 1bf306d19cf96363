"""The stand-in's HTTP server: OpenAI-shaped answers, failing health while it "loads"."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleet_svc.standin.options import Options

# Words a completion is made of: deterministic in the prompt, so a test can compare answers.
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
# A request body larger than this is refused rather than read.
MAX_BODY_BYTES = 1 << 20


def completion_text(prompt: str, max_tokens: int) -> str:
    """The stand-in's answer to `prompt`: `max_tokens` words chosen by the prompt's hash."""
    digest = hashlib.sha256(prompt.encode()).digest()
    count = max(1, min(max_tokens, 256))
    return " ".join(_WORDS[digest[i % len(digest)] % len(_WORDS)] for i in range(count))


class StandinState:
    """What the handlers read: the options and whether loading is over."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.ready = threading.Event()
        self.created = int(time.time())


class StandinServer(ThreadingHTTPServer):
    """A threaded HTTP server carrying the stand-in's state."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, state: StandinState) -> None:
        self.state = state
        super().__init__((state.options.host, state.options.port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: StandinServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        # Health checks every second would drown the log; requests are not what it is for.
        return

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if state.ready.is_set():
                self._send(200, {"status": "ok"})
            else:
                self._error(503, "loading the model", "service_unavailable")
            return
        if not state.ready.is_set():
            self._error(503, "loading the model", "service_unavailable")
            return
        if path == "/v1/models":
            opts = state.options
            entry: dict[str, Any] = {
                "id": opts.model,
                "object": "model",
                "created": state.created,
                "owned_by": opts.engine,
            }
            if opts.context_tokens is not None:
                entry["max_model_len"] = opts.context_tokens
            data = [] if opts.serve_no_model else [entry]
            self._send(200, {"object": "list", "data": data})
            return
        self._error(404, f"no route {path}", "not_found")

    def do_POST(self) -> None:
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route {path}", "not_found")
            return
        if not state.ready.is_set():
            self._error(503, "loading the model", "service_unavailable")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, "request body too large", "invalid_request_error")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            self._error(400, "the body is not a JSON object", "invalid_request_error")
            return
        self._send(200, answer(path, body, state))


def answer(path: str, body: dict[str, Any], state: StandinState) -> dict[str, Any]:
    """The OpenAI-shaped answer to a completion or chat completion request."""
    opts = state.options
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        max_tokens = 16
    if path == "/v1/chat/completions":
        messages = body.get("messages") or []
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        raw = body.get("prompt", "")
        prompt = "\n".join(map(str, raw)) if isinstance(raw, list) else str(raw)
    text = completion_text(prompt, max_tokens)
    prompt_tokens = len(prompt.split())
    completion_tokens = len(text.split())
    digest = hashlib.sha256(f"{opts.model}\0{prompt}".encode()).hexdigest()[:16]
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if path == "/v1/chat/completions":
        return {
            "id": f"chatcmpl-{digest}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": opts.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{digest}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": opts.model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": usage,
    }

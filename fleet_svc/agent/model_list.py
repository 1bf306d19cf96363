"""An engine's list of the models it serves, read the way the readiness check needs it."""

from __future__ import annotations

import json

import httpx

MAX_MODEL_LIST_BYTES = 1 << 20
"""A model list longer than this is not read: one replica's engine lists a handful."""


class ModelListError(Exception):
    """The engine's model list could not be read; the message says how."""


async def served_models(http: httpx.AsyncClient, url: str, timeout_s: float) -> set[str]:
    """The names the engine at `url` serves: every `data[].id` of an OpenAI-shaped list (vLLM,
    SGLang, trtllm-serve, llama-server), each `data[].aliases` entry too (llama-server lists
    its --alias there), skipping entries whose `status.value` says they are not loaded
    (llama-server's router mode lists models it could load).

    Raises:
        ModelListError: no answer, not 200, more than MAX_MODEL_LIST_BYTES, or not that shape.
    """
    try:
        async with http.stream("GET", url, timeout=timeout_s) as response:
            if response.status_code != 200:
                raise ModelListError(f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_MODEL_LIST_BYTES:
                    raise ModelListError(f"longer than {MAX_MODEL_LIST_BYTES} bytes")
    except (httpx.HTTPError, OSError) as exc:
        raise ModelListError(type(exc).__name__) from None
    try:
        doc = json.loads(body)
    except ValueError:
        raise ModelListError("not JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ModelListError("no data list")
    names: set[str] = set()
    for entry in data:
        if not isinstance(entry, dict):
            continue
        status = entry.get("status")
        if isinstance(status, dict) and status.get("value") not in (None, "loaded"):
            continue
        ids = [entry.get("id")]
        aliases = entry.get("aliases")
        if isinstance(aliases, list):
            ids.extend(aliases)
        names.update(i for i in ids if isinstance(i, str))
    return names


async def missing_model(
    http: httpx.AsyncClient,
    base_url: str,
    name: str,
    *,
    health_path: str,
    models_path: str,
    timeout_s: float,
) -> str:
    """Why the engine at `base_url` does not serve `name` yet, "" once its model list names it
    (any model, when `name` is ""): an engine can answer its health path with no model loaded
    (llama-server in router mode)."""
    try:
        listed = await served_models(http, base_url + models_path, timeout_s)
    except ModelListError as exc:
        wanted = name or "a model"
        return f"{models_path} answers no model list ({exc}); waiting for it to list {wanted}"
    if name in listed or (not name and listed):
        return ""
    if not name:
        return f"the engine answers {health_path} but {models_path} lists no model"
    shown = ", ".join(sorted(listed)[:5]) or "none"
    return f"the engine answers {health_path} but {models_path} lists {shown}, not {name}"

"""A Hub repo's weight bytes from its safetensors headers, every byte charged to the
resolution's budget before it is taken, nothing written to the Hugging Face cache.

`huggingface_hub.HfApi.get_safetensors_metadata` would do this with no bound: it downloads the
whole `model.safetensors.index.json` into the cache (a hostile 300 MB index stays there) and
reads every shard's header, up to its own ceiling each, however many shards the index names.
Here the index is streamed into memory and cut off at the budget, its shard count is checked
against the file budget before any shard is asked for, each header's declared length against
the byte budget before it is read, and a few headers are read at a time.

The layout read is safetensors' own (safetensors/docs: an 8-byte little-endian header length
N, then N bytes of JSON `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
{...}}`); N past 100,000,000 is refused as safetensors' own reader refuses it
(safetensors/src/tensor.rs, MAX_HEADER_SIZE, 0.4).
"""

from __future__ import annotations

import asyncio
import json
import struct
from urllib.parse import quote

import httpx

from planner_svc.domain.errors import InvalidShape
from planner_svc.sources.budget import FetchBudget

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100_000_000
"""safetensors' own ceiling on a header's length (tensor.rs MAX_HEADER_SIZE)."""
FIRST_READ_BYTES = 100_001
"""The first read of a shard: its length and, for nearly every real header, the whole header
(huggingface_hub reads the same 100 kB, bytes=0-100000)."""
HEADERS_AT_ONCE = 4
"""Shard headers read concurrently."""


class NotOnHub(Exception):
    """The file is not there (HTTP 404): the repo has no weights in this form."""


class Unreadable(Exception):
    """The Hub answered something other than the file (an HTTP error, a transport failure,
    malformed JSON): the weights are to be found another way."""


def _file_url(endpoint: str, repo: str, revision: str | None, path: str) -> str:
    return (
        f"{endpoint}/{quote(repo, safe='/')}/resolve/{quote(revision or 'main', safe='')}/"
        f"{quote(path, safe='/')}"
    )


async def _read(
    client: httpx.AsyncClient, url: str, budget: FetchBudget, what: str, start: int, length: int
) -> bytes:
    """Bytes [start, start + length) of `url`, or with `length` 0 its whole body. A range is
    charged to `budget` before it is asked for (so readers running at once can never pass the
    budget together); a whole body is checked by its declared length, then charged chunk by
    chunk as it comes off the wire. The connection is dropped once enough bytes are in."""
    headers = {"Accept-Encoding": "identity"}
    if length:
        budget.charge_bytes(length, what)
        headers["Range"] = f"bytes={start}-{start + length - 1}"
    try:
        async with client.stream("GET", url, headers=headers) as response:
            if response.status_code == 404:
                raise NotOnHub(url)
            if response.status_code not in (200, 206):
                raise Unreadable(f"HTTP {response.status_code}")
            skip = 0
            if length and response.status_code == 200 and start:
                skip = start  # the server ignored Range: what comes before is paid for too
                budget.charge_bytes(skip, what)
            declared = response.headers.get("Content-Length", "")
            if not length and declared.isdigit():
                budget.check_bytes(int(declared), what)
            parts: list[bytes] = []
            got = 0
            async for chunk in response.aiter_raw():
                if not length:
                    budget.charge_bytes(len(chunk), what)
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                parts.append(chunk)
                got += len(chunk)
                if length and got >= length:
                    break
            data = b"".join(parts)
            return data[:length] if length else data
    except httpx.HTTPError as error:
        raise Unreadable(f"{type(error).__name__}: {error}") from None


def _shard_names(raw: bytes, source: str) -> list[str]:
    """The distinct shard files an index's weight_map names; Unreadable when it is not one."""
    try:
        index = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise Unreadable(f"the index is not JSON ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise Unreadable("the index has no weight_map")
    names: set[str] = set()
    for value in weight_map.values():
        if (
            not isinstance(value, str)
            or not value.endswith(".safetensors")
            or value.startswith("/")
            or any(part in ("", ".", "..") for part in value.split("/"))
            or any(c in value for c in "?#\\")
            or len(value) > 1024
        ):
            raise InvalidShape(
                f"{source}'s {INDEX_FILE} names {str(value)[:120]!r} as a shard, which is not "
                "a .safetensors file of the repo.",
                source=source,
            )
        names.add(value)
    return sorted(names)


def _tensor_bytes(header: bytes, name: str) -> int:
    """The bytes of the tensors a safetensors header lists."""
    try:
        tensors = json.loads(header)
    except (ValueError, RecursionError) as error:
        raise Unreadable(f"{name}'s header is not JSON ({error})") from None
    if not isinstance(tensors, dict):
        raise Unreadable(f"{name}'s header is not a JSON object")
    total = 0
    for key, tensor in tensors.items():
        if key == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= 1 << 50
        ):
            raise Unreadable(f"{name}'s tensor {key[:80]!r} has no valid data_offsets")
        total += offsets[1] - offsets[0]
    return total


async def _header_bytes(
    client: httpx.AsyncClient, url: str, name: str, budget: FetchBudget, source: str
) -> int:
    budget.charge_file(f"the header of {name}")
    first = min(FIRST_READ_BYTES, max(8, budget.remaining_bytes))
    prefix = await _read(client, url, budget, f"the header of {name}", 0, first)
    if len(prefix) < 8:
        raise Unreadable(f"{name} is shorter than a safetensors header")
    (n,) = struct.unpack_from("<Q", prefix)
    if n > MAX_HEADER_BYTES:
        raise InvalidShape(
            f"{source}'s {name} declares a {n:,}-byte safetensors header, more than the "
            f"{MAX_HEADER_BYTES:,} safetensors itself reads; the file is corrupt or hostile.",
            source=source,
        )
    header = prefix[8 : 8 + n]
    if len(header) < n:
        rest = n - len(header)
        header += await _read(client, url, budget, f"the header of {name}", len(prefix), rest)
    if len(header) != n:
        raise Unreadable(f"{name} ends inside its header")
    return _tensor_bytes(header, name)


async def safetensors_weight_bytes(
    endpoint: str,
    repo: str,
    revision: str | None,
    budget: FetchBudget,
    *,
    token: str | None = None,
    source: str = "",
) -> int:
    """The tensor bytes a repo's safetensors headers list: the index's shards, else
    `model.safetensors`.

    Args:
        endpoint: the Hub's URL (HF_ENDPOINT).
        repo: `ORG/NAME`.
        revision: a branch, tag or commit (None: main).
        budget: the resolution's budget; every request and byte is charged to it.
        token: sent to the endpoint as a bearer token (httpx drops it on a redirect to
            another origin, such as the Hub's CDN).
        source: named in refusals.

    Raises:
        NotOnHub: the repo has neither file.
        Unreadable: the Hub did not answer them as safetensors.
        FetchLimitExceeded: the index, the shard count or a header passes the budget.
        InvalidShape: the index or a header is hostile (a shard outside the repo, a header
            past safetensors' own ceiling).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(max(1.0, budget.remaining_s))
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=True, max_redirects=5, headers=headers
    ) as client:
        index_url = _file_url(endpoint, repo, revision, INDEX_FILE)
        budget.charge_file(INDEX_FILE)
        try:
            raw = await _read(client, index_url, budget, INDEX_FILE, 0, 0)
        except NotOnHub:
            url = _file_url(endpoint, repo, revision, SINGLE_FILE)
            return await _header_bytes(client, url, SINGLE_FILE, budget, source)
        shards = _shard_names(raw, source)
        budget.check_files(len(shards), f"{len(shards):,} shards")
        places = asyncio.Semaphore(HEADERS_AT_ONCE)

        async def one(name: str) -> int:
            async with places:
                url = _file_url(endpoint, repo, revision, name)
                return await _header_bytes(client, url, name, budget, source)

        tasks = [asyncio.create_task(one(name)) for name in shards]
        try:
            return sum(await asyncio.gather(*tasks))
        finally:
            # The first refusal ends the rest: no shard is read past it.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

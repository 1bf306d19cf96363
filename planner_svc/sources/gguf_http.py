"""Reading a GGUF file's header over HTTP range requests or from a local path, never its tensors.

This is the transport: a local file read by offsets, or a remote one by `Range` requests
(following redirects; a server that ignores Range is streamed and dropped once the header is
read). What the bytes say is parsed by planner_svc/sources/gguf_header.py.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from typing import BinaryIO, NoReturn, Protocol
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

import httpx

from planner_svc.domain.errors import SourceUnreachable
from planner_svc.sources.budget import FetchBudget, current_budget
from planner_svc.sources.gguf_header import (
    DEFAULT_MAX_HEADER_BYTES,
    GGUFHeader,
    RangeReader,
    parse_gguf_header,
)

DEFAULT_TIMEOUT_S = 60.0


async def read_gguf_header(
    source: str,
    *,
    client: httpx.AsyncClient | None = None,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    budget: FetchBudget | None = None,
) -> GGUFHeader:
    """Read the header of the GGUF file at `source`, fetching only the header's bytes.

    Args:
        source: an http(s) URL (read with Range requests, following redirects), a file:// URL
            or a local path.
        client: an httpx client to reuse (its own timeouts apply); one is made when None.
        max_header_bytes: the most the header may take; a longer or hostile one is refused.
        timeout_s: a deadline for the whole read (and each network operation of our client).
        budget: the resolution's fetch budget (default: the one in force, `current_budget`).
    Returns:
        The parsed header (see `GGUFHeader`).
    Raises:
        InvalidShape: the bytes are not a GGUF header llama.cpp would read (bad magic, version
            or endianness, truncated, malformed, absurd lengths, over `max_header_bytes`).
        SourceUnreachable: the file cannot be fetched (no such file, HTTP error, network
            failure, timeout).
        FetchLimitExceeded: the header would pass the budget.
        ValueError: `max_header_bytes` is under 64.
    """
    budget = budget if budget is not None else current_budget()
    reader = _open(source, client, timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            return await parse_gguf_header(reader, source, max_header_bytes, budget)
    except TimeoutError:
        raise SourceUnreachable(
            message=f"Reading the GGUF header of {source} took longer than {timeout_s:g} s; "
            "check the server or raise the timeout.",
            source=source,
        ) from None
    finally:
        await reader.aclose()


def _open(source: str, client: httpx.AsyncClient | None, timeout_s: float) -> _Reader:
    parsed = urlparse(source)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return _HttpReader(source, client, timeout_s)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise SourceUnreachable(
                message=f"{source} names another host; file:// URLs must be local.",
                source=source,
            )
        return _FileReader(source, url2pathname(unquote(parsed.path)))
    # One-letter "schemes" are Windows drive letters; anything else is a real scheme.
    if scheme and len(scheme) > 1:
        raise SourceUnreachable(
            message=f"{source} uses the {scheme}:// scheme; give an http(s) URL, a file:// "
            "URL or a local path.",
            source=source,
        )
    return _FileReader(source, os.path.expanduser(source))


class _Reader(RangeReader, Protocol):
    """A RangeReader holding a file or a connection until closed."""

    async def aclose(self) -> None:
        """Release the file or connection."""
        ...


class _FileReader:
    """A local file, read by ranges as a remote one is."""

    def __init__(self, source: str, path: str) -> None:
        self.source = source
        self.file_bytes = 0
        self.bytes_fetched = 0
        self._path = path
        self._file: BinaryIO | None = None

    async def read(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes from `offset` (b"" at the end of the file)."""
        if self._file is None:
            self._file = await asyncio.to_thread(self._open)
        data = await asyncio.to_thread(_pread, self._file, offset, n)
        self.bytes_fetched += len(data)
        return data

    def _open(self) -> BinaryIO:
        try:
            file = open(self._path, "rb")  # noqa: SIM115 - closed in aclose()
        except FileNotFoundError:
            self._unreachable(f"There is no file at {self._path}; check the path.")
        except IsADirectoryError:
            self._unreachable(f"{self._path} is a directory; give the path of a .gguf file.")
        except OSError as exc:
            self._unreachable(f"{self._path} cannot be opened ({exc.strerror}); check it.")
        self.file_bytes = os.fstat(file.fileno()).st_size
        return file

    def _unreachable(self, message: str) -> NoReturn:
        raise SourceUnreachable(message=message, source=self.source)

    async def aclose(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _pread(file: BinaryIO, start: int, length: int) -> bytes:
    file.seek(start)
    return file.read(length)


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.IGNORECASE)


class _HttpReader:
    """A remote file read with Range requests; a server that ignores Range is streamed."""

    def __init__(self, url: str, client: httpx.AsyncClient | None, timeout_s: float) -> None:
        self.file_bytes = 0
        self.bytes_fetched = 0
        self._url = url
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))
        self._timeout_s = timeout_s
        # Set when the server answered 200 with the whole body: we read on from that stream
        # and drop the connection once the header is read, never the rest of the file.
        self._stream: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._pending = b""

    async def read(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes from `offset` (b"" past the end), counted in `bytes_fetched` as
        they come off the wire."""
        try:
            if self._stream is not None:
                return await self._read_stream(n)
            return await self._fetch_range(offset, n)
        except httpx.TimeoutException:
            self._unreachable(
                f"{self._url} did not answer in time; check the server or raise the timeout."
            )
        except httpx.InvalidURL:
            self._unreachable(f"{self._url} is not a valid URL; check it.")
        except httpx.HTTPError as exc:
            self._unreachable(
                f"{self._url} could not be fetched ({type(exc).__name__}: {exc}); check the "
                "URL and the network."
            )

    async def _fetch_range(self, start: int, length: int) -> bytes:
        # identity: a compressed answer would not line up with the byte ranges we ask for.
        headers = {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        request = self._client.build_request("GET", self._url, headers=headers)
        response = await self._client.send(request, stream=True, follow_redirects=True)
        keep_open = False
        try:
            status = response.status_code
            if status == 206:
                first, total = self._content_range(response)
                if first != start:
                    self._unreachable(
                        f"{self._url} answered a request for bytes from {start} with bytes "
                        f"from {first}; the server's range support is broken."
                    )
                if total:
                    self.file_bytes = total
                return await self._read_body(response, length)
            if status == 200:
                # Range ignored: this body is the whole file from byte 0.
                declared = response.headers.get("Content-Length", "")
                self.file_bytes = int(declared) if declared.isdigit() else 0
                self._stream = response
                self._chunks = response.aiter_bytes()
                keep_open = True
                if start:
                    await self._read_stream(start)  # skip what we already hold
                return await self._read_stream(length)
            if status == 416:
                _, total = self._content_range(response, required=False)
                self.file_bytes = total or start
                return b""
            self._raise_for_status(status)
        finally:
            if not keep_open:
                await response.aclose()

    def _content_range(self, response: httpx.Response, *, required: bool = True) -> tuple[int, int]:
        """(first byte, total size) from Content-Range; total 0 when the server gives '*'."""
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if match is None:
            if not required:
                return 0, 0
            self._unreachable(
                f"{self._url} answered a range request without a valid Content-Range; the "
                "server's range support is broken."
            )
        first = int(match.group(1)) if match.group(1) is not None else 0
        total = int(match.group(3)) if match.group(3) != "*" else 0
        return first, total

    async def _read_body(self, response: httpx.Response, length: int) -> bytes:
        """At most `length` bytes of `response`'s body (a server may send more than asked)."""
        parts: list[bytes] = []
        got = 0
        async for chunk in response.aiter_bytes():
            parts.append(chunk)
            got += len(chunk)
            self.bytes_fetched += len(chunk)
            # Read on to the body's end while it is what we asked for, so the connection
            # goes back to the pool; past that, hang up rather than take more.
            if got > length:
                break
        return b"".join(parts)[:length]

    async def _read_stream(self, length: int) -> bytes:
        """The next `length` bytes of the whole-file stream (fewer at its end)."""
        assert self._chunks is not None
        parts = [self._pending]
        got = len(self._pending)
        while got < length:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                break
            parts.append(chunk)
            got += len(chunk)
            # Counted when taken off the wire, whether or not the parser needs them.
            self.bytes_fetched += len(chunk)
        data = b"".join(parts)
        self._pending = data[length:]
        return data[:length]

    def _raise_for_status(self, status: int) -> NoReturn:
        if status in (404, 410):
            self._unreachable(
                f"{self._url} answered HTTP {status} (not found); check the URL (on Hugging "
                "Face, use a .../resolve/REVISION/FILE.gguf link)."
            )
        if status in (401, 403):
            self._unreachable(
                f"{self._url} refused access (HTTP {status}); give a URL that needs no "
                "credentials or a token the server accepts."
            )
        if status >= 500:
            self._unreachable(
                f"{self._url} answered HTTP {status} (server error); try again later."
            )
        self._unreachable(f"{self._url} answered HTTP {status}; check the URL.")

    def _unreachable(self, message: str) -> NoReturn:
        raise SourceUnreachable(message=message, source=self._url)

    async def aclose(self) -> None:
        """Drop the whole-file stream, if any, and close the client if it is ours."""
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None
        if self._own_client:
            await self._client.aclose()

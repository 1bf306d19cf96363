"""A GGUF file's header parsed from its leading bytes, read through a `read(offset, n)` source.

The layout read here is the GGUF v2/v3 format as ggml's `gguf.cpp` parses it (magic, version,
u64 tensor and KV counts, typed KV pairs, tensor infos, then the aligned data section); the
checks mirror the ones `gguf.cpp` makes, plus bounds on every length before anything is
allocated, so a hostile header costs at most `max_header_bytes` of reading. Where the bytes come
from (a local file, HTTP ranges) is the source's business: planner_svc/sources/gguf_http.py.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType, Keys

from planner_svc.domain.errors import InvalidShape
from planner_svc.sources.budget import FetchBudget

DEFAULT_MAX_HEADER_BYTES = 256 * 2**20

# Reading policy: the first read takes _FIRST_READ_BYTES; each further read takes what the
# parser needs or a quarter of what is already held, whichever is more. The last read then
# overshoots the header's end by at most 25%, so bytes fetched / header bytes <= 1.25 for any
# header of at least _FIRST_READ_BYTES, in O(log header) requests, whatever the file's size.
_FIRST_READ_BYTES = 8 * 1024
_GROWTH_DIVISOR = 4

# gguf.cpp reads counts as int64 and refuses GGUFv1 (u32 counts); ggml.h GGML_MAX_DIMS = 4.
_SUPPORTED_VERSIONS = (2, 3)
_MAX_DIMS = 4
_INT64_MAX = 2**63 - 1
# No real file comes near these (DeepSeek-V3 has ~1,800 tensors and ~50 keys); they bound the
# work and memory a hostile header can cause before the byte budget does.
_MAX_TENSORS = 1 << 20
_MAX_KV = 1 << 16
# Arrays longer than this, and every tokenizer array, are walked but not kept: a vocabulary of
# 150k strings is megabytes the planner never reads. Their length is kept in an ArraySummary.
_MAX_KEPT_ARRAY_ITEMS = 1024

_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_TYPE_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class RangeReader(Protocol):
    """A file read by byte ranges, as the parser needs it.

    `file_bytes` is the file's size once a read has told it (0 until then, or when the source
    never says); `bytes_fetched` counts what the reads took off the disk or the wire, which
    may be more than they returned.
    """

    file_bytes: int
    bytes_fetched: int

    async def read(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes from `offset`; b"" only at (or past) the end of the file.

        Raises:
            SourceUnreachable: the bytes cannot be read.
        """
        ...


@dataclass(frozen=True)
class ArraySummary:
    """An array in the header whose items were read past but not kept (e.g. a vocabulary)."""

    item_type: GGUFValueType
    length: int


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF header says, and what reading it cost.

    `metadata` maps keys to int/float/str/bool, lists of those, or an `ArraySummary` for
    tokenizer and other long arrays. `header_bytes` runs through the tensor infos up to the
    aligned start of the data section; `tensor_bytes` sums the tensors' data sizes (elements x
    type size); `file_bytes` is the file's size (0 when the server did not say);
    `bytes_fetched` is what was read to get here.
    """

    metadata: dict[str, object]
    tensor_count: int
    file_bytes: int
    header_bytes: int
    tensor_bytes: int
    bytes_fetched: int
    version: int = 3
    tensor_sizes: TensorSizes = field(default_factory=lambda: TensorSizes({}, {}))
    """The tensors' data sizes by block and by name (`TensorSizes`)."""


@dataclass(frozen=True)
class TensorSizes:
    """Tensor data sizes as llama.cpp places them: per block (`blk.N.*` summed by N) and the
    other tensors by name (token_embd.weight, output.weight, rope_freqs.weight, ...). Past
    `MAX_NAMED_TENSORS` names the rest are summed under "" (a real file has a few dozen)."""

    by_block: dict[int, int]
    by_name: dict[str, int]


class _Window:
    """The file's leading bytes, held in `buf` and grown on demand by the reading policy."""

    def __init__(
        self,
        reader: RangeReader,
        source: str,
        hard_limit: int,
        budget: FetchBudget | None = None,
    ) -> None:
        self.reader = reader
        self.source = source
        self.buf = bytearray()
        self.budget = budget
        self._eof = False
        self._hard_limit = hard_limit

    def over_budget(self, end: int, what: str) -> None:
        """Refuse (LIMIT_EXCEEDED) a header reaching byte `end` when only the resolution's
        byte budget stands in the way: within the header limit, past what the budget has
        left. Past the header limit the caller refuses it as hostile (InvalidShape)."""
        if self.budget is not None and end <= self._hard_limit:
            raise self.budget.exceeded(
                "max_fetch_bytes", self.budget.bytes + end, f"a GGUF header reaching {what}"
            )

    async def ensure(self, end: int, limit: int, what: str) -> None:
        """Make `buf` hold bytes [0, end); raise InvalidShape when the file or limit ends first."""
        if end > limit:
            self.over_budget(end, what)
            raise InvalidShape(
                message=f"The GGUF header of {self.source} runs past the {limit:,}-byte header "
                f"limit (at {what}); the file is corrupt or hostile (or raise max_header_bytes if "
                "the header is real).",
                source=self.source,
            )
        reader = self.reader
        while len(self.buf) < end:
            have = len(self.buf)
            if self._eof or (reader.file_bytes and end > reader.file_bytes):
                size = reader.file_bytes or have
                raise InvalidShape(
                    message=f"{self.source} ends at byte {size:,}, inside its GGUF header (at "
                    f"{what}); the file is truncated or not a GGUF file: download it again.",
                    source=self.source,
                )
            step = max(_FIRST_READ_BYTES if have == 0 else 0, have // _GROWTH_DIVISOR)
            want = min(max(end, have + step), limit)
            if reader.file_bytes:
                want = min(want, reader.file_bytes)
            data = await reader.read(have, want - have)
            if not data:
                self._eof = True
            self.buf += data


async def parse_gguf_header(
    reader: RangeReader,
    source: str,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    budget: FetchBudget | None = None,
) -> GGUFHeader:
    """Parse the GGUF header that `reader` reads, asking it for no more than the header needs.

    Args:
        reader: the file's bytes by ranges.
        source: the file's name in messages and errors.
        max_header_bytes: the most the header may take; a longer or hostile one is refused.
        budget: the resolution's budget (bytes, the file, array items), charged before each
            length is taken; None: only `max_header_bytes` bounds the read.
    Returns:
        The parsed header (see `GGUFHeader`).
    Raises:
        InvalidShape: the bytes are not a GGUF header llama.cpp would read (bad magic, version
            or endianness, truncated, malformed, absurd lengths, over `max_header_bytes`).
        FetchLimitExceeded: the header would pass `budget`.
        SourceUnreachable: the reader could not read the bytes.
        ValueError: `max_header_bytes` is under 64.
    """
    if max_header_bytes < 64:
        raise ValueError("max_header_bytes must be at least 64")
    window = _Window(reader, source, max_header_bytes, budget)
    limit = max_header_bytes
    if budget is not None:
        # The resolution's byte budget, where it is the tighter bound: a declared length is
        # refused against it before anything is read or allocated.
        budget.charge_file(f"the GGUF file {source[:200]}")
        limit = min(limit, max(64, budget.remaining_bytes))
    header = await _Parser(window, source, limit).parse()
    if budget is not None:
        budget.charge_bytes(header.bytes_fetched, "the GGUF header")
    return header


class _Parser:
    """Walks the header in `window.buf`, growing the window as it goes."""

    def __init__(self, window: _Window, source: str, limit: int) -> None:
        self.window = window
        self.source = source
        self.limit = limit
        self.pos = 0

    def fail(self, message: str) -> NoReturn:
        raise InvalidShape(message=message, source=self.source)

    async def need(self, n: int, what: str) -> int:
        """Ensure n more bytes at `pos`; return `pos` and advance past them."""
        start = self.pos
        if start + n > len(self.window.buf):
            await self.window.ensure(start + n, self.limit, what)
        self.pos = start + n
        return start

    async def u32(self, what: str) -> int:
        at = await self.need(4, what)
        return int(_U32.unpack_from(self.window.buf, at)[0])

    async def u64(self, what: str) -> int:
        at = await self.need(8, what)
        return int(_U64.unpack_from(self.window.buf, at)[0])

    async def string(self, what: str) -> str:
        n = await self.u64(what)
        self.check_room(n, 1, f"a string of {n:,} bytes at {what}")
        at = await self.need(n, what)
        return bytes(self.window.buf[at : at + n]).decode("utf-8", errors="replace")

    def check_room(self, count: int, item_bytes: int, what: str) -> None:
        """Refuse `count` items of at least `item_bytes` each that cannot fit in the limit."""
        if count * item_bytes > self.limit - self.pos:
            self.window.over_budget(self.pos + count * item_bytes, what)
            self.fail(
                f"The GGUF header of {self.source} declares {what}, which runs past the "
                f"{self.limit:,}-byte header limit; the file is corrupt or hostile (or raise "
                "max_header_bytes if the header is real)."
            )

    async def parse(self) -> GGUFHeader:
        """Read magic, version, counts, KV pairs and tensor infos."""
        at = await self.need(8, "the magic and version")
        buf = self.window.buf
        if _U32.unpack_from(buf, at)[0] != GGUF_MAGIC:
            self._bad_magic(bytes(buf[at : at + 4]))
        version = int(_U32.unpack_from(buf, at + 4)[0])
        self._check_version(version)
        tensor_count = await self.u64("the tensor count")
        kv_count = await self.u64("the key/value count")
        # Smallest tensor info: empty name (8), no dims (4), type (4), offset (8) = 24 bytes;
        # smallest KV pair: empty key (8), type (4), a one-byte value = 13 bytes.
        if tensor_count > _MAX_TENSORS:
            self.fail(
                f"The GGUF header of {self.source} declares {tensor_count:,} tensors (more than "
                f"{_MAX_TENSORS:,}); the file is corrupt or hostile."
            )
        if kv_count > _MAX_KV:
            self.fail(
                f"The GGUF header of {self.source} declares {kv_count:,} key/value pairs (more "
                f"than {_MAX_KV:,}); the file is corrupt or hostile."
            )
        self.check_room(tensor_count, 24, f"{tensor_count:,} tensors")
        self.check_room(kv_count, 13, f"{kv_count:,} key/value pairs")

        metadata: dict[str, object] = {}
        alignment = GGUF_DEFAULT_ALIGNMENT
        for i in range(kv_count):
            key = await self.string(f"key {i}")
            if key in metadata:
                self.fail(f"The GGUF header of {self.source} repeats key {key!r}; it is corrupt.")
            vtype = await self._value_type(await self.u32(f"the type of {key}"), key)
            metadata[key] = await self._value(vtype, key)
            if key == Keys.General.ALIGNMENT:
                alignment = self._check_alignment(vtype, metadata[key])

        tensor_bytes, data_end, sizes = await self._tensor_infos(tensor_count, alignment)
        # gguf.cpp pads to the alignment only when there are tensors.
        end = self.pos
        header_bytes = -(-end // alignment) * alignment if tensor_count else end
        file_bytes = self.window.reader.file_bytes
        if file_bytes and tensor_count and header_bytes + data_end > file_bytes:
            self.fail(
                f"{self.source} is {file_bytes:,} bytes but its tensors end at byte "
                f"{header_bytes + data_end:,}; the file is truncated: download it again."
            )
        return GGUFHeader(
            metadata=metadata,
            tensor_count=tensor_count,
            file_bytes=file_bytes,
            header_bytes=header_bytes,
            tensor_bytes=tensor_bytes,
            bytes_fetched=self.window.reader.bytes_fetched,
            version=version,
            tensor_sizes=sizes,
        )

    def _bad_magic(self, magic: bytes) -> NoReturn:
        hint = ""
        if magic.lstrip()[:1] in (b"<", b"{"):
            hint = " (it looks like a web page or JSON: use the file's download link)"
        self.fail(f"{self.source} is not a GGUF file: it starts with {magic!r}, not b'GGUF'{hint}.")

    def _check_version(self, version: int) -> None:
        if version in _SUPPORTED_VERSIONS:
            return
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        # gguf.cpp: a version whose low 16 bits are zero is a file of the other endianness.
        if version & 0xFFFF == 0 and swapped in _SUPPORTED_VERSIONS:
            self.fail(
                f"{self.source} is a big-endian GGUF file; only little-endian files are read: "
                "convert it with a little-endian gguf tool."
            )
        if version == 1:
            self.fail(f"{self.source} is a GGUF v1 file, which llama.cpp no longer reads.")
        self.fail(
            f"{self.source} is GGUF version {version}; only versions 2 and 3 are read: "
            "re-convert the model with a current llama.cpp."
        )

    async def _value_type(self, raw: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            self.fail(
                f"The GGUF header of {self.source} gives key {key!r} the unknown type {raw}; "
                "the file is corrupt or newer than this reader."
            )

    def _check_alignment(self, vtype: GGUFValueType, value: object) -> int:
        # gguf.cpp: general.alignment must be a u32 and a non-zero power of two.
        if vtype is not GGUFValueType.UINT32 or not isinstance(value, int):
            self.fail(f"{self.source} gives general.alignment as {vtype.name}, not UINT32.")
        if value <= 0 or value & (value - 1):
            self.fail(f"{self.source} gives general.alignment {value}, not a power of two.")
        return value

    async def _value(self, vtype: GGUFValueType, key: str) -> object:
        if vtype is GGUFValueType.STRING:
            return await self.string(f"the value of {key}")
        if vtype is GGUFValueType.ARRAY:
            return await self._array(key)
        fmt = _SCALAR_FORMATS[vtype]
        size = struct.calcsize(fmt)
        at = await self.need(size, f"the value of {key}")
        value: object = struct.unpack_from("<" + fmt, self.window.buf, at)[0]
        return value

    async def _array(self, key: str) -> object:
        item_type = await self._value_type(await self.u32(f"the item type of {key}"), key)
        count = await self.u64(f"the length of {key}")
        if item_type is GGUFValueType.ARRAY:
            # gguf.cpp refuses arrays of arrays ("invalid GGUF type").
            self.fail(f"The GGUF header of {self.source} nests arrays in key {key!r}.")
        keep = count <= _MAX_KEPT_ARRAY_ITEMS and not key.startswith("tokenizer.")
        if self.window.budget is not None:
            # Every item is walked: the count bounds the CPU, checked before the first one.
            self.window.budget.charge_items(count, f"{count:,} items in {key}")
        if item_type is GGUFValueType.STRING:
            self.check_room(count, 8, f"{count:,} strings in {key}")
            return await self._strings(key, count, keep)
        fmt = _SCALAR_FORMATS[item_type]
        size = struct.calcsize(fmt)
        self.check_room(count, size, f"{count:,} items in {key}")
        at = await self.need(count * size, f"the items of {key}")
        if not keep:
            return ArraySummary(item_type, count)
        return list(struct.unpack_from(f"<{count}{fmt}", self.window.buf, at))

    async def _strings(self, key: str, count: int, keep: bool) -> object:
        # The hot loop of a header (a vocabulary is 100k-250k strings): check the buffer
        # inline and only await the reader when it runs short.
        kept: list[str] = []
        buf = self.window.buf
        have = len(buf)  # `buf` only grows, in place, inside ensure()
        pos = self.pos
        limit = self.limit
        unpack = _U64.unpack_from
        what = f"the strings of {key}"
        for _ in range(count):
            if pos + 8 > have:
                self.pos = pos
                await self.window.ensure(pos + 8, limit, what)
                have = len(buf)
            n = unpack(buf, pos)[0]
            pos += 8
            end = pos + n
            if end > have:
                self.pos = pos
                self.check_room(n, 1, f"a string of {n:,} bytes in {key}")
                await self.window.ensure(end, limit, what)
                have = len(buf)
            if keep:
                kept.append(bytes(buf[pos:end]).decode("utf-8", errors="replace"))
            pos = end
        self.pos = pos
        return kept if keep else ArraySummary(GGUFValueType.STRING, count)

    async def _tensor_infos(self, count: int, alignment: int) -> tuple[int, int, TensorSizes]:
        """Walk the tensor infos; return (sum of data sizes, end of the last tensor's data,
        the sizes by block and name)."""
        total = 0
        expected_offset = 0
        data_end = 0
        table = TensorSizes({}, {})
        for i in range(count):
            name = await self.string(f"the name of tensor {i}")
            n_dims = await self.u32(f"the dimensions of tensor {name!r}")
            if n_dims > _MAX_DIMS:
                self.fail(
                    f"Tensor {name!r} in {self.source} has {n_dims} dimensions (at most "
                    f"{_MAX_DIMS}); the header is corrupt."
                )
            dims = [await self.u64(f"the shape of tensor {name!r}") for _ in range(n_dims)]
            elements = 1
            for d in dims:
                if d > _INT64_MAX or (d and elements > _INT64_MAX // d):
                    self.fail(
                        f"Tensor {name!r} in {self.source} has an impossible shape {dims}; the "
                        "header is corrupt."
                    )
                elements *= d
            raw_type = await self.u32(f"the type of tensor {name!r}")
            sizes = _TYPE_SIZES.get(raw_type)
            if sizes is None:
                self.fail(
                    f"Tensor {name!r} in {self.source} has ggml type {raw_type}, which this "
                    "reader does not know; the file is corrupt or newer than gguf 0.19."
                )
            block, type_bytes = sizes
            if dims and dims[0] % block:
                self.fail(
                    f"Tensor {name!r} in {self.source} has rows of {dims[0]} elements, not a "
                    f"multiple of its type's block of {block}; the header is corrupt."
                )
            nbytes = elements // block * type_bytes
            offset = await self.u64(f"the offset of tensor {name!r}")
            # gguf.cpp: each tensor starts where the previous one's padded data ends.
            if offset != expected_offset:
                self.fail(
                    f"Tensor {name!r} in {self.source} starts at data offset {offset:,}, not "
                    f"{expected_offset:,}; the header is corrupt."
                )
            total += nbytes
            _add_size(table, name, nbytes)
            data_end = offset + nbytes
            expected_offset = offset + -(-nbytes // alignment) * alignment
        return total, data_end, table


MAX_NAMED_TENSORS = 1024
"""Tensors outside the blocks kept by name (see `TensorSizes`)."""

_BLOCK = re.compile(r"blk\.(\d{1,9})\.")


def _add_size(sizes: TensorSizes, name: str, nbytes: int) -> None:
    """Count a tensor's bytes under its block, or under its name."""
    block = _BLOCK.match(name)
    if block is not None:
        index = int(block.group(1))
        sizes.by_block[index] = sizes.by_block.get(index, 0) + nbytes
        return
    key = name if name in sizes.by_name or len(sizes.by_name) < MAX_NAMED_TENSORS else ""
    sizes.by_name[key] = sizes.by_name.get(key, 0) + nbytes

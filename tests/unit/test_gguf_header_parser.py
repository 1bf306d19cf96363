"""The GGUF header parser on plain bytes: every value type, every truncation, lengths bounded
before anything is read or kept, and the refusals of hostile headers, with no file or server."""

from __future__ import annotations

import math
import struct
import tracemalloc
from collections.abc import Sequence
from typing import NamedTuple

import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from planner_svc.domain.errors import InvalidShape
from planner_svc.sources.gguf_header import ArraySummary, GGUFHeader, parse_gguf_header
from tests.support.gguf_files import raw_prefix, raw_string
from tests.support.gguf_hostile import ARCH_KV, HOSTILE_HEADERS, raw_kv, raw_tensor_info

V = GGUFValueType
F32 = int(GGMLQuantizationType.F32)
Q4_0 = int(GGMLQuantizationType.Q4_0)  # blocks of 32 elements in 18 bytes (ggml-common.h)


class BytesReader:
    """A RangeReader over bytes in memory that records every read it is asked for.

    `tells_size=False` stands for a source that never says how big the file is; `endless`
    for one that never ends (zeros after `data`), as a hostile server may stream.
    """

    def __init__(self, data: bytes, *, tells_size: bool = True, endless: bool = False) -> None:
        self.data = data
        self.file_bytes = 0
        self.bytes_fetched = 0
        self.reads: list[tuple[int, int]] = []
        self._tells_size = tells_size and not endless
        self._endless = endless

    async def read(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes from `offset`."""
        self.reads.append((offset, n))
        if self._tells_size:
            self.file_bytes = len(self.data)
        chunk = self.data[offset : offset + n]
        if self._endless:
            chunk += bytes(n - len(chunk))
        self.bytes_fetched += len(chunk)
        return chunk

    @property
    def furthest_byte(self) -> int:
        """The end of the furthest range asked for."""
        return max((offset + n for offset, n in self.reads), default=0)


def gguf(kvs: Sequence[bytes], tensors: Sequence[bytes] = (), *, version: int = 3) -> bytes:
    """A raw header: prefix, KV pairs, tensor infos (no padding, no data)."""
    return (
        raw_prefix(version=version, tensor_count=len(tensors), kv_count=len(kvs))
        + b"".join(kvs)
        + b"".join(tensors)
    )


async def parse(data: bytes, **reader: bool) -> tuple[GGUFHeader, BytesReader]:
    """Parse `data` through a BytesReader; the header and the reader."""
    source = BytesReader(data, **reader)
    return await parse_gguf_header(source, "mem.gguf"), source


@pytest.mark.parametrize(
    ("vtype", "payload", "want"),
    [
        (V.UINT8, struct.pack("<B", 255), 255),
        (V.INT8, struct.pack("<b", -1), -1),
        (V.UINT16, struct.pack("<H", 65535), 65535),
        (V.INT16, struct.pack("<h", -2), -2),
        (V.UINT32, struct.pack("<I", 2**32 - 1), 2**32 - 1),
        (V.INT32, struct.pack("<i", -3), -3),
        (V.FLOAT32, struct.pack("<f", 1.5), 1.5),
        (V.BOOL, struct.pack("<?", True), True),
        (V.UINT64, struct.pack("<Q", 2**64 - 1), 2**64 - 1),
        (V.INT64, struct.pack("<q", -(2**63)), -(2**63)),
        (V.FLOAT64, struct.pack("<d", -0.25), -0.25),
        (V.STRING, raw_string("héllo"), "héllo"),
        (V.STRING, raw_string(b"\xff!"), "\ufffd!"),
        (V.ARRAY, struct.pack("<IQ3I", V.UINT32, 3, 1, 2, 3), [1, 2, 3]),
        (V.ARRAY, struct.pack("<IQ2q", V.INT64, 2, -1, 2**40), [-1, 2**40]),
        (V.ARRAY, struct.pack("<IQ2?", V.BOOL, 2, True, False), [True, False]),
        (V.ARRAY, struct.pack("<IQf", V.FLOAT32, 1, 0.5), [0.5]),
        (
            V.ARRAY,
            struct.pack("<IQ", V.STRING, 2) + raw_string("a") + raw_string("bc"),
            ["a", "bc"],
        ),
        (V.ARRAY, struct.pack("<IQ", V.UINT8, 0), []),
    ],
    ids=lambda v: v.name if isinstance(v, GGUFValueType) else None,
)
async def test_every_value_type_reads_back(
    vtype: GGUFValueType, payload: bytes, want: object
) -> None:
    """Each GGUF value type, scalar, string or array, reads back as the value written, and a
    header without tensors ends where its last value does."""
    data = gguf([raw_kv("general.x", vtype, payload)])
    header, _ = await parse(data)
    assert header.metadata == {"general.x": want}
    assert type(header.metadata["general.x"]) is type(want)
    assert (header.tensor_count, header.header_bytes, header.tensor_bytes) == (0, len(data), 0)


@pytest.mark.parametrize(
    ("key", "item_type", "count", "items", "kept"),
    [
        ("general.x", V.UINT8, 1024, bytes([7]) * 1024, True),
        ("general.x", V.UINT8, 1025, bytes([7]) * 1025, False),
        ("tokenizer.ggml.scores", V.FLOAT32, 2, struct.pack("<2f", 0.0, 1.0), False),
        ("tokenizer.ggml.tokens", V.STRING, 2, raw_string("a") + raw_string("b"), False),
    ],
)
async def test_long_and_tokenizer_arrays_are_walked_not_kept(
    key: str, item_type: GGUFValueType, count: int, items: bytes, kept: bool
) -> None:
    """Arrays of over 1,024 items and every tokenizer array are read past and summarised by
    their type and length; shorter arrays are kept."""
    data = gguf([raw_kv(key, V.ARRAY, struct.pack("<IQ", item_type, count) + items)])
    header, _ = await parse(data)
    want = [7] * count if kept else ArraySummary(item_type, count)
    assert header.metadata[key] == want
    assert header.header_bytes == len(data)


class WithTensors(NamedTuple):
    """A file with two tensors: its bytes, where its raw header ends, where the aligned header
    ends (the data section's start) and its tensors' data size."""

    data: bytes
    raw_end: int
    header_end: int
    tensor_bytes: int


def with_tensors(alignment: int | None = None) -> WithTensors:
    """An F32 [32] tensor and a Q4_0 [64] one, after general.alignment when given."""
    kvs = [ARCH_KV]
    if alignment is not None:
        kvs.append(raw_kv("general.alignment", V.UINT32, struct.pack("<I", alignment)))
    align = alignment or 32  # GGUF_DEFAULT_ALIGNMENT
    a_bytes = 32 * 4
    b_offset = math.ceil(a_bytes / align) * align
    b_bytes = 64 // 32 * 18
    raw = gguf(
        kvs,
        [raw_tensor_info("a", [32], F32, 0), raw_tensor_info("b", [64], Q4_0, b_offset)],
    )
    header_end = math.ceil(len(raw) / align) * align
    data = raw + bytes(header_end - len(raw)) + bytes(b_offset + b_bytes)
    return WithTensors(data, len(raw), header_end, a_bytes + b_bytes)


@pytest.mark.parametrize("alignment", [None, 64, 256])
async def test_tensor_infos_are_summed_and_the_header_aligned(alignment: int | None) -> None:
    """Tensor data sizes add up by their ggml type's block size, and the header ends at the
    data section's start, padded to general.alignment (32 when absent)."""
    file = with_tensors(alignment)
    header, reader = await parse(file.data)
    assert (header.tensor_count, header.header_bytes) == (2, file.header_end)
    assert header.tensor_bytes == file.tensor_bytes
    assert header.file_bytes == len(file.data)
    assert header.bytes_fetched == reader.bytes_fetched <= len(file.data)


@pytest.mark.parametrize("tells_size", [True, False])
async def test_every_truncation_is_refused(tells_size: bool) -> None:
    """A file cut at any byte, in its header or (when the source says the file's size) in its
    tensor data, is refused as truncated."""
    file = with_tensors()
    # Without the size, only a cut inside the header's own bytes can be seen.
    cuts = range(len(file.data)) if tells_size else range(file.raw_end)
    for cut in cuts:
        with pytest.raises(InvalidShape) as err:
            await parse(file.data[:cut], tells_size=tells_size)
        assert "truncated" in err.value.message, (cut, err.value.message)
        assert err.value.source == "mem.gguf"
    header, _ = await parse(file.data, tells_size=tells_size)
    assert header.header_bytes == file.header_end


LIMIT = 4096
"""A small header limit, so that each length below exceeds it."""


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (raw_prefix(kv_count=1) + struct.pack("<Q", LIMIT), "a string of 4,096 bytes"),
        (
            raw_prefix(kv_count=1) + raw_kv("general.name", V.STRING, struct.pack("<Q", LIMIT)),
            "a string of 4,096 bytes",
        ),
        (
            raw_prefix(kv_count=1)
            + raw_kv("general.x", V.ARRAY, struct.pack("<IQ", V.UINT64, 512)),
            "512 items in general.x",
        ),
        (
            raw_prefix(kv_count=1)
            + raw_kv("general.x", V.ARRAY, struct.pack("<IQ", V.STRING, 512)),
            "512 strings in general.x",
        ),
        (
            raw_prefix(kv_count=1)
            + raw_kv("general.x", V.ARRAY, struct.pack("<IQQ", V.STRING, 1, LIMIT)),
            "a string of 4,096 bytes in general.x",
        ),
        (raw_prefix(tensor_count=LIMIT // 24), "170 tensors"),
        (raw_prefix(kv_count=LIMIT // 13), "315 key/value pairs"),
        (raw_prefix(tensor_count=1) + struct.pack("<Q", LIMIT), "a string of 4,096 bytes"),
    ],
    ids=[
        "key",
        "string-value",
        "array",
        "string-array",
        "string-in-array",
        "tensor-count",
        "kv-count",
        "tensor-name",
    ],
)
async def test_length_fields_are_bounded_before_reading(content: bytes, fragment: str) -> None:
    """A length or count that cannot fit in the header limit is refused when it is read, and
    the source (here one that never ends) is never asked for a byte past the limit."""
    reader = BytesReader(content, endless=True)
    with pytest.raises(InvalidShape) as err:
        await parse_gguf_header(reader, "mem.gguf", LIMIT)
    assert fragment in err.value.message
    assert "4,096-byte header limit" in err.value.message
    assert reader.furthest_byte <= LIMIT


async def test_a_header_past_the_limit_is_refused_there() -> None:
    """Values that each fit but together run past the limit are refused at the limit."""
    many = [raw_kv(f"general.k{i}", V.STRING, raw_string("x" * 100)) for i in range(60)]
    reader = BytesReader(gguf(many), endless=True)
    with pytest.raises(InvalidShape) as err:
        await parse_gguf_header(reader, "mem.gguf", LIMIT)
    assert "runs past the 4,096-byte header limit" in err.value.message
    assert reader.furthest_byte <= LIMIT


@pytest.mark.parametrize(
    ("content", "fragment"),
    [h[1:] for h in HOSTILE_HEADERS],
    ids=[h[0] for h in HOSTILE_HEADERS],
)
async def test_hostile_headers_are_refused_cheaply(content: bytes, fragment: str) -> None:
    """Every malformed or hostile header of the catalogue is a clear InvalidShape, reading no
    more than the file holds and allocating little whatever its lengths claim."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidShape) as err:
            await parse(content)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fragment in err.value.message
    assert peak < 8 * 2**20


@pytest.mark.parametrize("version", [2, 3])
async def test_gguf_v2_and_v3_are_read(version: int) -> None:
    """Both versions llama.cpp reads are read, and the header says which."""
    header, _ = await parse(gguf([ARCH_KV], version=version))
    assert (header.version, header.metadata) == (version, {"general.architecture": "llama"})


async def test_reads_grow_geometrically_and_stop_at_the_file_end() -> None:
    """A large header is read in O(log n) reads overshooting its end by at most 25%, none past
    the end of the file once the source has said its size."""
    n = 40_000
    tokens = struct.pack("<IQ", V.STRING, n) + b"".join(raw_string(f"t{i}") for i in range(n))
    raw = gguf([raw_kv("tokenizer.ggml.tokens", V.ARRAY, tokens)])
    header, reader = await parse(raw + bytes(1 << 20))
    assert header.metadata["tokenizer.ggml.tokens"] == ArraySummary(V.STRING, n)
    assert header.header_bytes == len(raw)
    assert reader.bytes_fetched <= 1.25 * len(raw)
    assert len(reader.reads) <= 3 + math.log(len(raw) / 8192, 1.25)
    # A header that ends where the file does: once the size is known no read passes it.
    _, reader = await parse(raw)
    assert max(offset + n for offset, n in reader.reads[1:]) == len(raw)


async def test_a_limit_under_64_bytes_is_a_caller_error() -> None:
    """A header limit too small for any header is the caller's mistake, not the file's."""
    with pytest.raises(ValueError, match="at least 64"):
        await parse_gguf_header(BytesReader(b""), "mem.gguf", 63)

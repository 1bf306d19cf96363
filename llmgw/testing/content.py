"""What the test and demo servers serve: real bytes, or a real head over zeros made on demand.

A `SparseFile` lets a repo hold a real safetensors header over gigabytes of tensors that never
exist in memory: a billion-parameter model costs a few kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# safetensors dtype names and their element sizes (the format's own table).
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class SparseFile:
    """A file made of `head` followed by zeros up to `size` bytes, generated when read."""

    head: bytes
    size: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file (clamped to its size)."""
        end = min(end, self.size)
        if start >= end:
            return b""
        head = self.head[start:end]
        return head + bytes(end - start - len(head))


Content = bytes | SparseFile


def content_size(content: Content) -> int:
    """A file's size in bytes."""
    return content.size if isinstance(content, SparseFile) else len(content)


def read_content(content: Content, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file."""
    if isinstance(content, SparseFile):
        return content.read(start, end)
    return content[start:end]


def content_id(content: Content) -> str:
    """A file's sha256, what the Hub names an LFS file by. For a sparse file, a hash of its
    head and size stands in (hashing gigabytes of zeros would prove nothing)."""
    if isinstance(content, SparseFile):
        return hashlib.sha256(content.head + content.size.to_bytes(8, "little")).hexdigest()
    return hashlib.sha256(content).hexdigest()


def git_blob_id(data: bytes) -> str:
    """The git blob id of `data`: what the Hub sends as a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    """The bytes a tensor of `dtype` and `shape` takes in a safetensors file."""
    count = 1
    for dim in shape:
        count *= dim
    return count * DTYPE_BYTES[dtype]


def safetensors_file(
    tensors: Mapping[str, tuple[str, Sequence[int]]], *, metadata: Mapping[str, str] | None = None
) -> SparseFile:
    """A safetensors file with a real header for `tensors` ({name: (dtype, shape)}) and zeroed
    data: 8-byte little-endian header length, the JSON header (padded with spaces to 8 bytes,
    as the format's writer does), then each tensor's bytes at its `data_offsets`."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = tensor_bytes(dtype, shape)
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return SparseFile(head=head, size=len(head) + offset)

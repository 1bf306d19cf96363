"""Bench: reading a GGUF header over HTTP ranges costs the header, not the file.

Writes three sparse GGUF files with one realistic tokenizer (a 150k-token BPE vocabulary and
as many merges, like Llama 3's or Qwen's): a 1 GB file (the baseline), the same header padded to
400 GB ("400 GB*"), and a 405B-like model's header with 400 GB of tensors. It serves them from a
local range server, reads each header N times (interleaved) and prints, measured in this run:
bytes fetched / header bytes for each, and each read time over the baseline's.

Run: .venv/bin/python bench/gguf_header.py [--reads N] [--tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gguf import GGMLQuantizationType

# Run as a script from the repository: make the test helpers (tests.support) importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.testing.range_server import RangeServer
from planner_svc.sources.gguf_http import read_gguf_header
from tests.support.gguf_files import (
    WrittenGGUF,
    llama_tensors,
    tokenizer_kv,
    write_gguf,
)

GB = 10**9


def write(folder: Path, name: str, n_tokens: int, big_model: bool, size: int) -> WrittenGGUF:
    """A Llama-3.2-1B-like (Q4_0) or Llama-3.1-405B-like (Q6_K) file, padded to `size`.

    All carry the same tokenizer, so their headers differ only by their tensor infos.
    """
    if big_model:
        blocks, embd, heads, ff, qtype = 126, 16384, 128, 53248, "Q6_K"
    else:
        blocks, embd, heads, ff, qtype = 16, 2048, 32, 8192, "Q4_0"
    return write_gguf(
        folder / name,
        arch="llama",
        block_count=blocks,
        n_embd=embd,
        n_head=heads,
        n_head_kv=8,
        context_length=131072,
        extra_kv={
            **tokenizer_kv(n_tokens, merges=n_tokens),
            "llama.rope.dimension_count": embd // heads,
        },
        tensors=llama_tensors(
            block_count=blocks,
            n_embd=embd,
            n_head=heads,
            n_head_kv=8,
            n_ff=ff,
            n_vocab=n_tokens,
            ggml_type=GGMLQuantizationType[qtype],
        ),
        pad_to_bytes=size,
    )


async def measure(server: RangeServer, files: dict[str, WrittenGGUF], reads: int) -> None:
    """Read each file's header `reads` times, alternating files, and print the figures."""
    times: dict[str, list[float]] = {label: [] for label in files}
    fetched: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(reads):
            for label, written in files.items():
                start = time.perf_counter()
                header = await read_gguf_header(server.url(written.path.name), client=client)
                times[label].append(time.perf_counter() - start)
                fetched[label] = header.bytes_fetched
                assert header.header_bytes == written.header_bytes
    server.wait_idle()
    print(
        f"{'file':>8} {'file bytes':>16} {'header bytes':>13} {'fetched':>11} {'ratio':>6} "
        f"{'median ms':>10} {'min ms':>8} {'served/read':>12}"
    )
    for label, written in files.items():
        served = server.served_bytes(written.path.name) / reads
        print(
            f"{label:>8} {written.file_bytes:>16,} {written.header_bytes:>13,} "
            f"{fetched[label]:>11,} {fetched[label] / written.header_bytes:>6.3f} "
            f"{statistics.median(times[label]) * 1e3:>10.1f} {min(times[label]) * 1e3:>8.1f} "
            f"{served:>12,.0f}"
        )
    base = statistics.median(times["1 GB"])
    for label in files:
        if label != "1 GB":
            ratio = statistics.median(times[label]) / base
            print(f"time ratio {label} / 1 GB (medians, same run): {ratio:.3f}")


def main() -> None:
    """Parse arguments, write the files, serve them and measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--reads", type=int, default=20, help="reads of each header")
    parser.add_argument("--tokens", type=int, default=150_000, help="vocabulary size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        files = {
            "1 GB": write(folder, "small.gguf", args.tokens, False, 1 * GB),
            # The same header padded to 400 GB: only the file's size differs.
            "400 GB*": write(folder, "padded.gguf", args.tokens, False, 400 * GB),
            # A 405B model's own header (1,137 tensor infos) and 333 GB of tensors.
            "400 GB": write(folder, "big.gguf", args.tokens, True, 400 * GB),
        }
        print(
            f"wrote {len(files)} sparse files in {time.perf_counter() - start:.1f} s; "
            f"{args.reads} reads each, {args.tokens:,} tokens + merges"
        )
        with RangeServer(folder) as server:
            asyncio.run(measure(server, files, args.reads))


if __name__ == "__main__":
    main()

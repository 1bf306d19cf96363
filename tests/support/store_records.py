"""Catalog records as the store keeps them, for the store suites (both stores, and the
SQLite-only cases)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from fleet_svc.store.base import ModelRecord

# A catalog model as the fleet stores it: the llmgw.common.v1.Model JSON form, proto field names
# (int64 fields as strings, as protobuf's JSON mapping writes them).
LLAMA_SPEC: dict[str, Any] = {
    "name": "llama-3.1-8b",
    "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
    "context_length": "131072",
    "max_output": "8192",
    "profiles": [
        {
            "name": "h100",
            "engine": "vllm",
            "args": ["--max-model-len", "131072", "--gpu-memory-utilization", "0.9"],
            "gpu_class": "H100-80GB",
            "gpus_per_node": 1,
            "tp": 1,
            "replicas": 2,
        }
    ],
}


def model(
    name: str = "llama-3.1-8b",
    *,
    deleted: bool = False,
    spec: dict[str, Any] | None = None,
    updated_by: str = "alice@example.com",
    updated_at: float = 1_764_000_000.25,
    declared_in: str = "",
) -> ModelRecord:
    """A model record to write; the store assigns the revision."""
    return ModelRecord(
        name=name,
        revision=0,
        spec=LLAMA_SPEC if spec is None else spec,
        updated_by=updated_by,
        updated_at=updated_at,
        deleted=deleted,
        declared_in=declared_in,
    )


def garble_an_index_page(path: Path, page_bytes: int = 4096) -> None:
    """Overwrite the last index root page of a closed SQLite store file with garbage (0xFF: not
    one of the four b-tree page types), wherever the schema puts it: quick_check reports a bad
    index page as damage, where on a table's page SQLite fails the check itself "malformed"."""
    with closing(sqlite3.connect(path)) as raw:
        row = raw.execute("SELECT MAX(rootpage) FROM sqlite_master WHERE type = 'index'").fetchone()
    page = int(row[0])
    with path.open("r+b") as f:
        f.seek((page - 1) * page_bytes)  # pages count from 1
        f.write(b"\xff" * page_bytes)

"""The shared test vectors (gen/go/testdata/vectors, written by tests/support/vectors.py) in the
Python runtime: each decodes from its binary and its JSON to the same message and encodes again
byte for byte; gen/go/vectors checks the Go runtime against the same files. And the folder is
what the protos make now: a new enum value gets its vector."""

from __future__ import annotations

import json

import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from tests.support import vectors as make_vectors

INDEX = json.loads((make_vectors.VECTORS / "index.json").read_text())


def test_the_vectors_are_what_the_protos_make_now() -> None:
    """Every enum value of protos/ has its vector, and no file is stale."""
    have = {p.name: p.read_bytes() for p in make_vectors.VECTORS.iterdir()}
    want = make_vectors.files()
    assert sorted(have) == sorted(want)
    assert [n for n in want if have[n] != want[n]] == []
    assert sum(v["name"].startswith("enum.") for v in INDEX) >= 60


def message(type_name: str) -> Message:
    desc = descriptor_pool.Default().FindMessageTypeByName(type_name)
    return message_factory.GetMessageClass(desc)()


@pytest.mark.parametrize("vector", INDEX, ids=[v["name"] for v in INDEX])
def test_a_vector_round_trips_byte_for_byte(vector: dict[str, str]) -> None:
    folder = make_vectors.VECTORS
    want_bin = (folder / f"{vector['name']}.binpb").read_bytes()
    want_json = (folder / f"{vector['name']}.json").read_bytes()
    from_bin = message(vector["type"])
    from_bin.ParseFromString(want_bin)
    assert from_bin.SerializeToString(deterministic=True) == want_bin
    from_json = message(vector["type"])
    json_format.Parse(want_json, from_json)
    assert from_json == from_bin
    assert make_vectors.canonical_json(from_bin) == want_json

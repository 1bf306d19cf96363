"""Write the shared test vectors: golden binary and JSON encodings of representative messages,
which the Python (tests/unit/test_vectors.py) and Go (gen/go/vectors) tests both decode and
encode again byte for byte, so the two runtimes cannot drift apart on the wire.

Each vector is NAME.binpb (deterministic binary) and NAME.json (proto JSON with the default
options, compacted: no whitespace, since Go's protojson varies its whitespace on purpose)
under gen/go/testdata/vectors, listed in index.json with its message type. The vectors: one
message per value of every enum in protos/ (set in the first field of that enum type the
generator finds), a nested Model (profiles, shape with layer shapes, origin), a
WatchReplicasResponse with an Endpoint and a timestamp, an InventoryNode with a map, and a
google.rpc.Status carrying ErrorInfo, RetryInfo and BadRequest as Any.

`python -m tests.support.vectors` rewrites them; `--check` fails when they differ from what the
protos make now (a new enum value, say).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import any_pb2, descriptor, duration_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.planner.v1 import planner_pb2

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "gen" / "go" / "testdata" / "vectors"
FILES = (common_pb2, planner_pb2, fleet_pb2, agent_pb2)


def canonical_json(msg: Message) -> bytes:
    """Proto JSON with the default options, compacted."""
    text = json_format.MessageToJson(msg, indent=None)
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False).encode()


def binary(msg: Message) -> bytes:
    return msg.SerializeToString(deterministic=True)


def _messages(file: descriptor.FileDescriptor) -> Iterator[descriptor.Descriptor]:
    todo = list(file.message_types_by_name.values())
    while todo:
        m = todo.pop(0)
        if not m.GetOptions().map_entry:
            yield m
        todo.extend(m.nested_types)


def _enums() -> Iterator[descriptor.EnumDescriptor]:
    for module in FILES:
        yield from module.DESCRIPTOR.enum_types_by_name.values()
        for m in _messages(module.DESCRIPTOR):
            yield from m.enum_types


def _holder(enum: descriptor.EnumDescriptor) -> tuple[descriptor.Descriptor, str]:
    """The first message (in file order) with a singular field of `enum`'s type."""
    for module in FILES:
        for m in _messages(module.DESCRIPTOR):
            for f in m.fields:
                if f.enum_type is enum and not _repeated(f):
                    return m, f.name
    raise SystemExit(f"no message holds a field of {enum.full_name}")


def _repeated(field: descriptor.FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _class(desc: descriptor.Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


def _packed(*details: Message) -> list[any_pb2.Any]:
    out = []
    for d in details:
        holder = any_pb2.Any()
        holder.Pack(d)
        out.append(holder)
    return out


def vectors() -> list[tuple[str, Message]]:
    """(name, message) of every vector."""
    out: list[tuple[str, Message]] = []
    for enum in _enums():
        holder, field = _holder(enum)
        for value in enum.values:
            msg = _class(holder)()
            setattr(msg, field, value.number)
            out.append((f"enum.{enum.full_name}.{value.name}", msg))
    model = common_pb2.Model(
        name="llama-3.1-8b",
        source="hf://meta-llama/Llama-3.1-8B-Instruct",
        origin=common_pb2.Origin(
            repo="meta-llama/Llama-3.1-8B-Instruct",
            revision="0e9e39f249a16976918f6564b8830bc894c89659",
            files=[common_pb2.OriginFile(path="config.json", bytes=826)],
        ),
        context_length=131072,
        max_output=4096,
        profiles=[
            common_pb2.Profile(
                name="h100",
                engine="vllm",
                args=["--enable-prefix-caching"],
                gpu_class="H100-80GB",
                gpus_per_node=2,
                tp=2,
                replicas=3,
                engine_version="0.11.0",
            ),
            common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True, min_memory_gb=16),
        ],
        shape=common_pb2.ModelShape(
            architecture="LlamaForCausalLM",
            layers=2,
            attention_heads=32,
            kv_heads=8,
            head_dim_k=128,
            head_dim_v=128,
            trained_context=131072,
            weights_bytes=16060522496,
            kv_bytes_per_token=131072,
            layer_kinds=[common_pb2.LAYER_KIND_FULL, common_pb2.LAYER_KIND_SLIDING],
            layer_shapes=[
                common_pb2.LayerShape(
                    kind=common_pb2.LAYER_KIND_FULL, kv_heads=8, head_dim_k=128, head_dim_v=128
                ),
                common_pb2.LayerShape(
                    kind=common_pb2.LAYER_KIND_SLIDING, kv_heads=8, window_tokens=4096
                ),
            ],
            kv_dtype_bytes=2,
            format="safetensors",
            notes=['ünïcode and "quotes"'],
        ),
    )
    out.append(("model.nested", model))
    out.append(
        (
            "fleet.watch_replicas_added",
            fleet_pb2.WatchReplicasResponse(
                kind=fleet_pb2.WatchReplicasResponse.KIND_ADDED,
                endpoint=fleet_pb2.Endpoint(
                    replica_id="llama-3.1-8b-h100-7f3a",
                    model="llama-3.1-8b",
                    profile="h100",
                    address="10.0.3.7:8000",
                    phase=fleet_pb2.REPLICA_PHASE_READY,
                    revision=4,
                    node="gpu-a",
                    engine="vllm",
                    api_dialect=fleet_pb2.API_DIALECT_OPENAI,
                    context_tokens=32768,
                    max_output=4096,
                    slots=1,
                    cards=2,
                    gpus=[0, 1],
                    gpu_class="H100-80GB",
                    weight=200,
                    ready_since=timestamp_pb2.Timestamp(seconds=1767323045, nanos=250000000),
                ),
                seq=9007199254740993,
                epoch="f1c2",
                time=timestamp_pb2.Timestamp(seconds=1767323046),
            ),
        )
    )
    out.append(
        (
            "common.inventory_node_map",
            common_pb2.InventoryNode(
                name="gpu-a",
                gpu_class="H100-80GB",
                gpus=8,
                free_gpus=6,
                gpu_memory_bytes=85520809984,
                memory_bytes=2199023255552,
                engine_versions={"vllm": "0.11.0"},
            ),
        )
    )
    delay = duration_pb2.Duration(seconds=1, nanos=500000000)
    out.append(
        (
            "rpc.status_error_details",
            status_pb2.Status(
                code=14,
                message="this fleet does not lead: the leader is fleet-b at 10.0.0.2:50052",
                details=_packed(
                    error_details_pb2.ErrorInfo(
                        reason="NOT_LEADER",
                        domain="fleet.llmgw.dev",
                        metadata={"leader_address": "10.0.0.2:50052"},
                    ),
                    error_details_pb2.RetryInfo(retry_delay=delay),
                    error_details_pb2.BadRequest(
                        field_violations=[
                            error_details_pb2.BadRequest.FieldViolation(
                                field="model.profiles[0].gpus_per_node",
                                description="0 cards",
                                reason="INVALID_MODEL",
                            )
                        ]
                    ),
                ),
            ),
        )
    )
    return out


def files() -> dict[str, bytes]:
    """Every file of the folder, by name."""
    index = []
    out: dict[str, bytes] = {}
    for name, msg in vectors():
        index.append({"name": name, "type": msg.DESCRIPTOR.full_name})
        out[f"{name}.binpb"] = binary(msg)
        out[f"{name}.json"] = canonical_json(msg)
    out["index.json"] = (json.dumps(index, indent=1) + "\n").encode()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when the folder differs")
    opts = parser.parse_args()
    want = files()
    if opts.check:
        have = {p.name: p.read_bytes() for p in VECTORS.iterdir()} if VECTORS.is_dir() else {}
        drift = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
        for n in drift:
            print(
                f"test vector drifted: {n} (run python -m tests.support.vectors)", file=sys.stderr
            )
        return 1 if drift else 0
    VECTORS.mkdir(parents=True, exist_ok=True)
    for stale in VECTORS.iterdir():
        if stale.name not in want:
            stale.unlink()
    for name, data in want.items():
        (VECTORS / name).write_bytes(data)
    print(f"{len(want)} files in {VECTORS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Model shapes built by hand from real configs (numbers from tests/fixtures/hf, see its
PROVENANCE.md), for tests that need a shape without reading a source."""

from __future__ import annotations

from llmgw.common.v1 import common_pb2
from llmgw.shape import Layer, LayerKind, ModelShape


def dense(
    name: str,
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    trained: int,
    weights_bytes: int,
) -> ModelShape:
    """A dense GQA/MHA model: every layer full attention with the same geometry."""
    layer = Layer(LayerKind.FULL, kv_heads=kv_heads, head_dim_k=head_dim, head_dim_v=head_dim)
    return ModelShape(
        architecture=name,
        layers=(layer,) * layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        trained_context=trained,
        weights_bytes=weights_bytes,
    )


# meta-llama/Llama-3.1-8B-Instruct: 32 layers, 32 heads, 8 KV heads of 128, 131072 trained,
# 16,060,522,496 bytes of BF16 weights; 131,072 B of KV a token.
LLAMA_31_8B = dense(
    "llama",
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    trained=131_072,
    weights_bytes=16_060_522_496,
)

# meta-llama/Llama-3.1-70B-Instruct: 80 layers, 64 heads, 8 KV heads of 128;
# 141,107,412,992 bytes of BF16 weights.
LLAMA_31_70B = dense(
    "llama",
    layers=80,
    heads=64,
    kv_heads=8,
    head_dim=128,
    trained=131_072,
    weights_bytes=141_107_412_992,
)

# Qwen/Qwen2.5-7B-Instruct: 28 layers, 28 heads, 4 KV heads of 128, 32768 trained;
# 15,231,233,024 bytes. 28 heads split 1, 2, 4, 7 … ways, never 3.
QWEN25_7B = dense(
    "qwen2",
    layers=28,
    heads=28,
    kv_heads=4,
    head_dim=128,
    trained=32_768,
    weights_bytes=15_231_233_024,
)


def inline(shape: ModelShape) -> common_pb2.ModelShape:
    """A dense `shape` as a person writes it inline in a request (model.shape: layer count,
    heads, head widths; no per-layer list), so the planner reads no source."""
    first = shape.layers[0]
    if first.kind is not LayerKind.FULL or any(la != first for la in shape.layers):
        raise ValueError(f"{shape.architecture}: only a dense shape is written this way")
    return common_pb2.ModelShape(
        architecture=shape.architecture,
        layers=len(shape.layers),
        attention_heads=shape.attention_heads,
        kv_heads=shape.kv_heads,
        head_dim_k=first.head_dim_k,
        head_dim_v=first.head_dim_v,
        trained_context=shape.trained_context,
        weights_bytes=shape.weights_bytes,
    )


def inline_data(shape: ModelShape) -> dict[str, object]:
    """`inline(shape)` as a model file writes it (YAML or JSON data, proto field names)."""
    return {field.name: value for field, value in inline(shape).ListFields()}


def llama_8b_model(**fields: object) -> common_pb2.Model:
    """Llama-3.1-8B with its shape inline and one vLLM profile on one H100; `fields` replace
    the model's (`profiles` a list of Profile messages, `shape` a ModelShape message or None
    for no inline shape)."""
    model = common_pb2.Model(
        name="llama-8b",
        context_length=8192,
        shape=inline(LLAMA_31_8B),
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
            )
        ],
    )
    for key, value in fields.items():
        if key == "profiles":
            del model.profiles[:]
            model.profiles.extend(value)  # type: ignore[arg-type]
        elif key == "shape":
            model.ClearField("shape")
            if value is not None:
                model.shape.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(model, key, value)
    return model

"""The demo's example catalog: a GGUF model served by llama.cpp and a Hugging Face repo
served by vLLM, each with one replica on one card, their files served by the demo's file
server."""

from __future__ import annotations

from llmgw.common.v1 import common_pb2
from llmgw.demo.hf_repo import REPO

GGUF_MODEL = "tiny-llama-gguf"
HF_MODEL = "tiny-llama-hf"
GGUF_FILE = "tiny-llama.gguf"
"""The tiny model's file name in the served folder."""


def example_models(*, gguf_source: str, gpu_class: str) -> list[common_pb2.Model]:
    """The two example models.

    Args:
        gguf_source: where the GGUF model is read from: the file server's URL of it, or its
            local path where a real llama-server runs it (llama-server's `-m` takes a path).
        gpu_class: the class of the local agent's cards, e.g. "H100-80GB".
    """
    gguf = common_pb2.Model(
        name=GGUF_MODEL,
        source=gguf_source,
        context_length=4096,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="llamacpp",
                args=["--ctx-size", "4096", "--parallel", "1"],
                gpu_class=gpu_class,
                gpus_per_node=1,
                replicas=1,
            )
        ],
    )
    hf = common_pb2.Model(
        name=HF_MODEL,
        source=f"hf://{REPO}",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192", "--tensor-parallel-size", "1"],
                gpu_class=gpu_class,
                gpus_per_node=1,
                tp=1,
                replicas=1,
            )
        ],
    )
    return [gguf, hf]

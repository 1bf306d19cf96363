"""The demo's models: the tiny GGUF loads and runs in the real llama.cpp and reads as the
shape it was written with; the example catalog is one the fleet accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_svc.rpc.convert import entry_in as validate
from llmgw.demo.catalog import GGUF_MODEL, HF_MODEL, example_models
from llmgw.demo.hf_repo import REPO
from llmgw.demo.tiny_gguf import TinyLlama, vocabulary, write_tiny_gguf
from planner_svc.sources.resolver import ShapeResolver
from tests.oracle import libllama

# The child imports llama.cpp's ctypes bindings over the libllama `make llama-server` builds,
# as tests/oracle does; loads the model, tokenizes, decodes a prompt and greedily generates
# eight tokens.
_CHILD = (
    libllama.import_code()
    + r"""
import ctypes, json

@lib.llama_log_callback
def quiet(level, text, user):
    pass

lib.llama_log_set(quiet, ctypes.c_void_p(0))
lib.llama_backend_init()
model = lib.llama_model_load_from_file(sys.argv[1].encode(), lib.llama_model_default_params())
assert model, "the model did not load"
vocab = lib.llama_model_get_vocab(model)
text = b"hello the gateway"
tokens = (lib.llama_token * 64)()
n = lib.llama_tokenize(vocab, text, len(text), tokens, 64, True, False)
params = lib.llama_context_default_params()
params.n_ctx = 256
ctx = lib.llama_init_from_model(model, params)
rc = lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, n))
n_vocab = lib.llama_vocab_n_tokens(vocab)
picked, text = [], b""
piece = ctypes.create_string_buffer(64)
for _ in range(8):
    logits = lib.llama_get_logits_ith(ctx, -1)
    best = max(range(n_vocab), key=lambda i: logits[i])
    picked.append(best)
    size = lib.llama_token_to_piece(vocab, best, piece, 64, 0, True)
    text += piece.raw[:size]
    one = (lib.llama_token * 1)(best)
    lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1))
print(json.dumps({"tokens": list(tokens[:n]), "decode": rc, "n_vocab": n_vocab,
                  "picked": picked, "text": text.decode()}))
"""
)


def test_tiny_gguf_is_written_the_same_every_time(tmp_path: Path) -> None:
    """The model's bytes are seeded: two writes give the same file."""
    a = write_tiny_gguf(tmp_path / "a.gguf").read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf").read_bytes()
    assert a == b
    assert len(a) < 1 << 20


@pytest.mark.skipif(os.environ.get("LLMGW_SKIP_ORACLE") == "1", reason="LLMGW_SKIP_ORACLE=1")
def test_tiny_gguf_runs_in_llama_cpp(tmp_path: Path) -> None:
    """llama.cpp loads the tiny model, tokenizes text with its vocabulary (BOS first, byte
    fallback for the rest) and answers with its letter and word pieces: readable text."""
    assert libllama.built(), libllama.BUILD_HINT
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=libllama.child_env(),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    tokens, _scores, _types = vocabulary()
    assert out["n_vocab"] == len(tokens)
    assert out["tokens"][0] == 1 and len(out["tokens"]) > 3
    assert out["decode"] == 0
    first_piece = tokens.index("▁")
    assert all(first_piece <= t < len(tokens) for t in out["picked"])
    assert out["text"].strip() and out["text"].isprintable()


async def test_tiny_gguf_reads_as_its_geometry(tmp_path: Path) -> None:
    """The planner reads the file as the geometry it was written with."""
    g = TinyLlama()
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    shape = await ShapeResolver().resolve(str(path))
    assert (shape.architecture, len(shape.layers)) == ("llama", g.layers)
    assert (shape.attention_heads, shape.kv_heads) == (g.heads, g.kv_heads)
    assert shape.trained_context == g.context_tokens


def test_example_catalog_is_accepted_by_the_fleet() -> None:
    """Both example models pass the fleet's checks, one llama.cpp and one vLLM profile with
    one replica each on the agent's card class."""
    models = example_models(gguf_source="http://127.0.0.1:1/files/x.gguf", gpu_class="L4-24GB")
    for model in models:
        validate(model)
    by_name = {m.name: m for m in models}
    assert by_name[GGUF_MODEL].profiles[0].engine == "llamacpp"
    assert by_name[HF_MODEL].profiles[0].engine == "vllm"
    assert by_name[HF_MODEL].source == f"hf://{REPO}"
    assert {(p.gpu_class, p.replicas) for m in models for p in m.profiles} == {("L4-24GB", 1)}

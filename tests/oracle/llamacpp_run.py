"""Run the real llama.cpp (the libllama that `make llama-server` builds beside llama-server) on a
GGUF and read back what it prints.

Each model runs in a child process (`python -c`), which loads it once and creates one
llama.cpp context per setting through the library's C API, capturing llama.cpp's log through
its log callback; the parent parses the printed cache lines into numbers. A setting that
crashes the child (an abort inside ggml) is reported as a crash and the child is restarted
for the settings after it.

The C API sets every field llama-server sets (`common_context_params_to_llama`,
common/common.cpp:1629-1666): n_ctx, n_seq_max, kv_unified, type_k/type_v, flash_attn_type,
n_batch/n_ubatch, swa_full, so the library runs exactly llama-server's context. The high-level
`llama_cpp.Llama` class exposes neither n_seq_max nor kv_unified and is not used; the child
imports only llama-cpp-python's ctypes module over that libllama (tests/oracle/libllama.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tests.oracle import libllama

# ggml.h enum ggml_type values of the cache types llama-server accepts.
GGML_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
# include/llama.h enum llama_flash_attn_type.
FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}


@dataclass(frozen=True)
class ContextParams:
    """The llama_context_params fields a run sets (the rest keep the library's defaults)."""

    n_ctx: int
    n_seq_max: int
    kv_unified: bool
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    n_batch: int = 2048
    n_ubatch: int = 512
    swa_full: bool = False
    decode: bool = False
    """Also decode a few tokens and report whether the logits are finite."""


@dataclass(frozen=True)
class KvLine:
    """One `llama_kv_cache: size = …` line; MiB figures as printed (two decimals)."""

    role: str
    """"kv" for a lone cache, "base" / "swa" for the two caches of a sliding-window model,
    "indexer" for deepseek32's indexer key cache (src/llama-kv-cache-dsa.cpp)."""
    size_mib: str
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    k_mib: str
    type_v: str
    v_mib: str


@dataclass(frozen=True)
class RsLine:
    """The `llama_memory_recurrent: size = …` line."""

    size_mib: str
    cells: int
    layers: int
    seqs: int
    r_mib: str
    s_mib: str


@dataclass(frozen=True)
class Printed:
    """What llama.cpp printed for one context."""

    ok: bool
    """Whether the context was created."""
    crashed: bool = False
    error: str = ""
    n_ctx: int = 0
    n_ctx_seq: int = 0
    n_ubatch: int = 0
    flash_attn: bool | None = None
    """Whether flash attention ended up on (None when nothing said)."""
    kv: tuple[KvLine, ...] = ()
    recurrent: RsLine | None = None
    compute_mib: dict[str, float] = field(default_factory=dict)
    decoded: bool | None = None
    """With `decode`: whether decoding 8 tokens succeeded with finite logits."""
    log: str = ""


def printed_mib(n_bytes: int) -> str:
    """Bytes as llama.cpp prints them: float32 MiB with two decimals
    (src/llama-kv-cache.cpp:301, `(float) bytes / (1024.0f * 1024.0f)` printed "%7.2f")."""
    value = np.float32(n_bytes) / np.float32(1024.0 * 1024.0)
    return f"{float(value):.2f}"


def llama_cpp_missing() -> str | None:
    """Why llama.cpp cannot be run here (None when its library loads)."""
    return libllama.missing()


def run_contexts(
    model: Path, params: Sequence[ContextParams], timeout_s: float = 120
) -> list[Printed]:
    """Create one llama.cpp context per `params` on `model` (CPU only) and parse each log.

    Args:
        model: a GGUF file.
        params: the contexts to create, in order.
        timeout_s: limit for one child process.
    Returns:
        One `Printed` per params, in order.
    Raises:
        RuntimeError: the model does not load.
    """
    results: list[Printed] = []
    while len(results) < len(params):
        todo = params[len(results) :]
        job = {"model": str(model), "runs": [asdict(p) for p in todo]}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=json.dumps(job),
            # GGML_NO_BACKTRACE: ggml's abort handler would otherwise attach gdb for a
            # backtrace (ggml/src/ggml.c).
            env=libllama.child_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if lines and lines[0].get("model_loaded") is False:
            raise RuntimeError(f"llama.cpp did not load {model}: {lines[0]['log'][-2000:]}")
        done = [parse_log(r["ok"], r["log"], r.get("decoded")) for r in lines if "ok" in r]
        results.extend(done)
        if len(done) < len(todo):
            # The child died inside the next context: record it and go on after it.
            results.append(Printed(ok=False, crashed=True, error=proc.stderr[-2000:]))
    return results


_SIZE = r"\s*([\d.]+) MiB"
_KV_RE = re.compile(
    r"llama_kv_cache: size =" + _SIZE + r" \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/\s*(\d+) "
    r"seqs\), K \((\w+)\):" + _SIZE + r", V \((\w+)\):" + _SIZE
)
_RS_RE = re.compile(
    r"llama_memory_recurrent: size =" + _SIZE + r" \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) "
    r"seqs\s+\d+ rs_seq\), R \(\w+\):" + _SIZE + r", S \(\w+\):" + _SIZE
)
_CTX_RE = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_ubatch)\s+= (\d+)")
_COMPUTE_RE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =" + _SIZE)
_ERROR_RE = re.compile(r"(llama_init_from_model: .*|failed to initialize the context: .*)")


def parse_log(ok: bool, log: str, decoded: bool | None = None) -> Printed:
    """Parse llama.cpp's log of one context creation.

    The lines parsed are printed by src/llama-kv-cache.cpp:301 (cache size),
    src/llama-kv-cache-iswa.cpp:75/91 ("creating non-SWA / SWA KV cache"),
    src/llama-kv-cache-dsa.cpp ("creating main / indexer KV cache"),
    src/llama-memory-recurrent.cpp (recurrent size), src/llama-context.cpp:308-315 (n_ctx …,
    flash_attn) and :546-552 (auto flash attention resolved), and sched_reserve's compute
    buffer sizes.
    """
    kv: list[KvLine] = []
    role = "kv"
    ctx: dict[str, int] = {}
    compute: dict[str, float] = {}
    flash: bool | None = None
    recurrent: RsLine | None = None
    errors: list[str] = []
    for line in log.splitlines():
        if "creating non-SWA KV cache" in line:
            role = "base"
        elif "creating     SWA KV cache" in line:
            role = "swa"
        elif "creating main KV cache" in line:
            role = "kv"
        elif "creating indexer KV cache" in line:
            role = "indexer"
        if m := _KV_RE.search(line):
            size, cells, layers, seqs, streams, tk, k, tv, v = m.groups()
            kv.append(KvLine(role, size, int(cells), int(layers), int(seqs), int(streams), tk,
                             k, tv, v))  # fmt: skip
        elif m := _RS_RE.search(line):
            size, cells, layers, seqs, r, s = m.groups()
            recurrent = RsLine(size, int(cells), int(layers), int(seqs), r, s)
        elif m := _CTX_RE.search(line):
            ctx[m.group(1)] = int(m.group(2))
        elif m := _COMPUTE_RE.search(line):
            compute[m.group(1)] = float(m.group(2))
        elif "llama_context: flash_attn" in line:
            word = line.rsplit("=", 1)[1].strip()
            flash = {"enabled": True, "disabled": False}.get(word, flash)
        elif "Flash Attention enabled" in line:
            flash = True
        elif "Flash Attention not supported" in line:
            flash = False
        if not ok and (m := _ERROR_RE.search(line)):
            errors.append(m.group(1))
    return Printed(
        ok=ok,
        error=" | ".join(errors),
        n_ctx=ctx.get("n_ctx", 0),
        n_ctx_seq=ctx.get("n_ctx_seq", 0),
        n_ubatch=ctx.get("n_ubatch", 0),
        flash_attn=flash,
        kv=tuple(kv),
        recurrent=recurrent,
        compute_mib=compute,
        decoded=decoded,
        log=log,
    )


# The child: load the model once, create and free one context per run, print one JSON line
# per run as soon as it is done (so a crash loses only the run that crashed).
_CHILD = (
    libllama.import_code()
    + f"""
import ctypes, json, math
GGML_TYPES = {GGML_TYPES!r}
FLASH_ATTN_TYPES = {FLASH_ATTN_TYPES!r}
job = json.loads(sys.stdin.read())
chunks = []

@lib.llama_log_callback
def _log(level, text, user_data):
    # 1 = GGML_LOG_LEVEL_DEBUG (ggml/include/ggml.h): per-layer and per-tensor dumps.
    if level != 1:
        chunks.append(text.decode("utf-8", "replace"))

lib.llama_log_set(_log, ctypes.c_void_p(0))
lib.llama_backend_init()
mparams = lib.llama_model_default_params()
mparams.n_gpu_layers = 0
model = lib.llama_model_load_from_file(job["model"].encode(), mparams)
if not model:
    print(json.dumps({{"model_loaded": False, "log": "".join(chunks)}}), flush=True)
    sys.exit(0)
for run in job["runs"]:
    chunks.clear()
    cp = lib.llama_context_default_params()
    cp.n_ctx = run["n_ctx"]
    cp.n_seq_max = run["n_seq_max"]
    cp.kv_unified = run["kv_unified"]
    cp.type_k = GGML_TYPES[run["type_k"]]
    cp.type_v = GGML_TYPES[run["type_v"]]
    cp.flash_attn_type = FLASH_ATTN_TYPES[run["flash_attn"]]
    cp.n_batch = run["n_batch"]
    cp.n_ubatch = run["n_ubatch"]
    cp.swa_full = run["swa_full"]
    cp.n_threads = 1
    cp.n_threads_batch = 1
    ctx = lib.llama_init_from_model(model, cp)
    decoded = None
    if ctx and run["decode"]:
        tokens = (lib.llama_token * 8)(*range(1, 9))
        rc = lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, 8))
        logits = lib.llama_get_logits_ith(ctx, -1) if rc == 0 else None
        n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
        decoded = rc == 0 and all(math.isfinite(logits[i]) for i in range(n_vocab))
    print(json.dumps({{"ok": bool(ctx), "log": "".join(chunks), "decoded": decoded}}), flush=True)
    if ctx:
        lib.llama_free(ctx)
lib.llama_model_free(model)
"""
)

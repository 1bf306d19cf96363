"""InternVL's vision tower in vLLM's profile run (llmgw/engines/vllm_tower.py): its tiling read
from the config, how many dummy images V0 and V1 encode at once, and the peak that follows."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.engines.base import CardTotals
from llmgw.engines.versions import pick
from llmgw.engines.vllm import GRAMMAR
from llmgw.engines.vllm_peak import vllm_profile
from llmgw.engines.vllm_rules import VLLM_RULES
from llmgw.engines.vllm_tower import (
    INTERNVIT_BYTES_PER_WIDTH,
    PIXEL_BYTES,
    internvit_images,
    internvit_peak,
)
from llmgw.shape import VISION_TOWER_INTERNVIT
from planner_svc.domain.hf_compute import compute_from_hf_config
from tests.unit.test_vllm_logged_runs import GIB, RUNS, need_of, shape_of

RUN = next(r for r in RUNS if r["id"] == "log-0.6.6-l40s-x8-internvl3-78b-tp8-u0.92")
V0 = pick(VLLM_RULES, "0.6.6")[0]
V1 = pick(VLLM_RULES, "0.10.2")[0]


def internvl_config(**top: Any) -> dict[str, Any]:
    """An InternVL chat config with InternVL3-78B's tower and tiling (its language model cut
    to what the reader needs); `top` overrides top-level keys."""
    config: dict[str, Any] = {
        "model_type": "internvl_chat",
        "architectures": ["InternVLChatModel"],
        "downsample_ratio": 0.5,
        "force_image_size": 448,
        "max_dynamic_patch": 12,
        "min_dynamic_patch": 1,
        "use_thumbnail": True,
        "select_layer": -1,
        "llm_config": {
            "model_type": "qwen2",
            "hidden_size": 8192,
            "intermediate_size": 29568,
            "num_hidden_layers": 80,
            "vocab_size": 151674,
        },
        "vision_config": {
            "model_type": "intern_vit_6b",
            "hidden_size": 3200,
            "image_size": 448,
            "patch_size": 14,
            "num_attention_heads": 25,
            "intermediate_size": 12800,
        },
    }
    config.update(top)
    return config


def test_the_tiling_is_read_from_an_internvl_config() -> None:
    """12 tiles and the thumbnail of 1024 patches and a class token for the tower, 256 tokens
    a tile for the language model: 3328 an image, the 53248 / 16 the logged run printed."""
    compute = compute_from_hf_config(internvl_config())
    assert compute.vision_tower == VISION_TOWER_INTERNVIT
    assert (compute.vision_hidden_size, compute.vision_image_size) == (3200, 448)
    assert (compute.vision_item_tiles, compute.vision_tile_tokens) == (13, 1025)
    assert compute.vision_item_tokens == 3328 == 53248 // 16
    assert compute.hidden_size == 8192 and compute.vision
    single = compute_from_hf_config(internvl_config(max_dynamic_patch=1))
    assert single.vision_item_tiles == 1  # no thumbnail beside a single tile
    assert single.vision_item_tokens == 512  # vLLM's count adds it all the same


@pytest.mark.parametrize(
    "top",
    [
        {"model_type": "llava"},
        {"downsample_ratio": True},
        {"downsample_ratio": 0},
        {"downsample_ratio": "0.5"},
        {"force_image_size": None, "vision_config": {"hidden_size": 3200, "patch_size": 14}},
        {"vision_config": "InternViT"},
        {"force_image_size": 7, "vision_config": {"hidden_size": 3200, "patch_size": 14}},
    ],
)
def test_a_config_the_reader_cannot_trust_gives_no_tower(top: dict[str, Any]) -> None:
    """Another model type, a ratio that is not a fraction in (0, 1], a tile of unknown size or
    smaller than a patch: no InternViT terms, so sizing falls back to the language model's."""
    compute = compute_from_hf_config(internvl_config(**top))
    assert compute.vision_tower == ""
    assert compute.vision_item_tokens == compute.vision_item_tiles == 0


def test_v0_cuts_the_requests_by_the_images_tokens() -> None:
    """V0 gives max_num_batched_tokens // (images x 3328) requests (at least 1) each of the
    limit's images: 1 request of 16 at 8192 tokens (the log's warning), 2 of 1, 19 of 1 at
    65536, and never more than max_num_seqs."""
    shape = shape_of(RUN)
    assert internvit_images(shape, V0, 16, 8192, 256) == 16
    assert internvit_images(shape, V0, 1, 8192, 256) == 2
    assert internvit_images(shape, V0, 1, 65536, 256) == 19
    assert internvit_images(shape, V0, 1, 65536, 4) == 4
    assert internvit_images(shape, V0, 0, 8192, 256) == 0


def test_v1_encodes_the_images_its_encoder_budget_holds() -> None:
    """V1 encodes max(1, min(max(batched, 3328) // 3328, seqs x the limit)) images: 2 at 8192
    tokens whatever the limit, 1 on a small card's 2048, and no more than seqs x the limit; the
    count does not follow the context (vLLM's cap of a prompt's images by max_model_len is
    left out, the safe side), so V1's overheads stay the same for every context."""
    shape = shape_of(RUN)
    assert internvit_images(shape, V1, 16, 8192, 256) == 2
    assert internvit_images(shape, V1, 1, 8192, 256) == 2
    assert internvit_images(shape, V1, 1, 2048, 256) == 1
    assert internvit_images(shape, V1, 16, 65536, 1) == 16
    assert internvit_images(shape, V1, 16, 65536, 256) == 19
    v1 = {**RUN, "gpu": "H100-80GB", "cuda_total_gib": 79.19}
    short = need_of({**v1, "args": ["--max-model-len", "4096", *RUN["args"][2:]]}, "0.10.2")
    long = need_of({**v1, "args": ["--max-model-len", "32768", *RUN["args"][2:]]}, "0.10.2")
    assert short.activation_bytes == long.activation_bytes


def test_the_peak_is_the_tiles_tokens_at_the_width_and_their_pixels() -> None:
    """16 images of 13 tiles: 213,200 tower tokens x 3200 x 24 B and 208 tiles of 448² float32
    RGB pixels, 15.72 GiB against the 15.73 printed (the row the figure comes from)."""
    peak = internvit_peak(shape_of(RUN), 16)
    assert peak == 213_200 * 3200 * INTERNVIT_BYTES_PER_WIDTH + 208 * 448 * 448 * PIXEL_BYTES
    assert abs(peak / GIB - RUN["printed"]["activation_gib"]) < 0.02
    assert internvit_peak(shape_of(RUN), 0) == 0


def test_the_logged_run_is_sized_by_its_tower_and_fewer_images_leave_more_pool() -> None:
    """Under 0.6.6 the tower over 16 images is the peak (it was the language model's 2 GiB,
    a pool four times the printed one); 4 images a prompt make it a quarter and the pool
    grows by the difference; under a V1 range 1 image (2 on a large card's 8192-token batch) is
    encoded and the peak is far lower; image=0 leaves the tower out."""
    logged = need_of(RUN)
    assert abs(logged.activation_bytes / GIB - 15.73) < 0.02
    assert "the vision tower's over 16 dummy image(s) of 13 tiles (15.72 GiB)" in logged.rules
    assert abs(logged.kv_pool_bytes / GIB - RUN["printed"]["available_kv_gib"]) < 0.15
    args = list(RUN["args"])
    four = need_of({**RUN, "args": [*args[:-1], "image=4"]})
    assert four.activation_bytes == internvit_peak(shape_of(RUN), 4)
    assert four.kv_pool_bytes - logged.kv_pool_bytes == (
        logged.activation_bytes - four.activation_bytes
    )
    v1 = need_of(RUN, "0.10.2")  # a 44 GiB card's 2048-token batch: a budget of one image
    assert internvit_peak(shape_of(RUN), 1) <= v1.activation_bytes < 3 * GIB
    total = int(79.19 * GIB)
    card = CardTotals("H100-80GB", total, total, "printed")
    large = vllm_profile(GRAMMAR, RUN["args"], card=card, tokens=8192, engine_version="0.10.2")
    assert large.batched_tokens == 8192
    count = internvit_images(shape_of(RUN), large.rules, 16, large.batched_tokens, 1024)
    assert count == 2
    none = need_of({**RUN, "args": [*args[:-1], "image=0"]})
    assert none.activation_bytes < 3 * GIB < logged.activation_bytes
    assert "vision tower" not in none.rules and "vision tower" not in v1.rules

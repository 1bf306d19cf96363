"""The vision tower's part of vLLM's profile run for an InternVL chat model (InternViT): how
many dummy images the run encodes at once, under V0's and V1's rules, and what the tower holds
per token at its peak.

How many images (at most tiles each, `Compute.vision_item_tiles`):
- V0 (vllm/worker/model_runner.py `profile_run`, 0.5-0.7): the decoder-only runner cuts its dummy
  requests to max_num_batched_tokens // (images a prompt x an image's tokens), at least 1 (the
  warning "Computed max_num_seqs (min(256, 8192 // 53248)) to be less than 1" of the logged
  InternVL3-78B run), and each request carries `--limit-mm-per-prompt` images; the model's
  forward runs the tower over all of them before the language model.
- V1 (vllm/v1/worker/utils.py MultiModalBudget.get_max_items, read at a 2025-26 main): the
  encoder budget is max(max_num_batched_tokens, an image's tokens); the run encodes
  max(1, min(budget // an image's tokens, max_num_seqs x images a prompt)) images and keeps
  their outputs while the language model's dummy batch runs. vLLM caps a prompt's images at
  max_model_len // an image's tokens too; the planner takes the limit itself, so that the
  figure does not follow the context (V1's overheads are worked out once for every context,
  vllm_memory.vllm_overhead): the count is then at most the encoder budget's, which binds
  unless max_num_seqs is 1 or 2, and otherwise larger, the safe side.

What the tower holds per token (vllm/model_executor/models/intern_vit.py): the layer's input
(the residual), the embeddings the encoder was called with, norm1's output, the fused QKV, and,
while the K of an InternViT-6B (qk_normalization) is normalised, the normalised Q and K's two
float32 copies (RMSNorm.forward_native): 22 bytes of tower width a token in bf16 (the smaller
InternViT-300M has no QK norm, but its MLP, 4 x the width and not split at TP 1, holds fc1's
output and its GELU beside the residual, the embeddings and norm2's output: 22 too). The tiles'
float32 pixels stay alive beside it. When 25 heads do not divide by the TP size, vLLM
replicates the attention (InternSdpaAttention, vllm-project/vllm#8061), so those widths do not
shrink with tensor parallel; the MLP's do, and it is not the peak.
"""

from __future__ import annotations

from llmgw.engines.vllm_rules import VllmRules
from llmgw.shape import VISION_TOWER_INTERNVIT, ModelShape

INTERNVIT_BYTES_PER_WIDTH = 24
"""Bytes a tower token holds at the peak for each unit of the tower's width. The one logged run
gives 24.02: InternVL3-78B under vLLM 0.6.6.post1 on 8 x L40S ("PyTorch activation peak memory
takes 15.73GiB" over 16 images of 13 tiles, 213,200 tower tokens of width 3200, less the tiles'
float32 pixels; logged_runs.jsonl). The widths named above account for 22 of it."""

INTERNVIT_MARGIN = 0.10
"""How far the figure may stray: the widths' count (22) lies 8 % under the logged 24."""

PIXEL_BYTES = 3 * 4
"""A tile's pixels as the tower receives them: three float32 channels a pixel (InternVL's
image processor normalises to float32; the runner moves them to the card as they are)."""


def internvit_images(
    shape: ModelShape, rules: VllmRules, images: int, batched: int, seqs: int
) -> int:
    """How many dummy images vLLM's profile run sends through an InternViT tower at once (0 for
    other models or when `--limit-mm-per-prompt` allows none): `images` a prompt, a batch of
    `batched` tokens and `seqs` requests."""
    compute = shape.compute
    if compute is None or compute.vision_tower != VISION_TOWER_INTERNVIT or images <= 0:
        return 0
    item = compute.vision_item_tokens
    if item <= 0:
        return 0
    if rules.v0:
        return max(1, min(seqs, batched // (images * item))) * images
    return max(1, min(max(batched, item) // item, seqs * images))


def internvit_peak(shape: ModelShape, count: int) -> int:
    """The tower's torch peak while it encodes `count` images at most tiles."""
    compute = shape.compute
    if compute is None or count <= 0:
        return 0
    tiles = count * compute.vision_item_tiles
    tokens = tiles * compute.vision_tile_tokens
    pixels = tiles * compute.vision_image_size**2 * PIXEL_BYTES
    return tokens * compute.vision_hidden_size * INTERNVIT_BYTES_PER_WIDTH + pixels

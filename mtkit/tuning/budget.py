"""The GPU batch budget of translation: how many source tokens x beam one batch may carry,
sized at load from the GPU memory free then, where the checkpoint's decode.batch_tokens
is the default (sized for a CPU)."""

from __future__ import annotations

import logging

import torch

from mtkit.core.config import Config
from mtkit.core.search_options import BATCH_TOKENS
from mtkit.model.cache import preallocated_capacity

log = logging.getLogger(__name__)

GPU_MEMORY_SHARE = 0.25  # of the memory free at load, for the search of one batch
MAX_DEVICE_BATCH_TOKENS = 512_000


def device_batch_tokens(
    cfg: Config, vocab_size: int, free: int, element_bytes: int = 2, models: int = 1
) -> dict:
    """The batch budget on a GPU where the checkpoint's decode.batch_tokens is the
    default (sized for a CPU: a GPU searching so few tokens at a time waits on its
    host), and its record: what `GPU_MEMORY_SHARE` of the `free` bytes holds.

    A budget of N is N source tokens x beam, so a batch of sources of S tokens carries
    N / S rows. For each of `models` models a row holds, in elements of `element_bytes`
    (2 in bf16): its self-attention keys/values three times over (a preallocated cache,
    its reorder, and a captured step's copy: `mtkit.search.captured`), 6 x layers x C x
    d_model for C positions (the output limit max_len_a x S + max_len_b and bos, rounded
    up as `preallocated_capacity` rounds it), and its share of its source's keys/values,
    at most 2 x layers x S x d_model; and its logits with their fp32 log-probabilities
    and the search's work on them, 12 bytes per target piece. The costliest per budget
    token is the shortest source (S = 1: a row's logits for a one-token source), which
    sets the budget, never below the CPU default nor above `MAX_DEVICE_BATCH_TOKENS`.
    Captured steps of other shapes are bounded apart (`captured.SLOT_MEMORY_SHARE`)."""
    d, m = cfg.decode, cfg.model
    limit = int(d.max_len_a * 1 + d.max_len_b)  # the longest output of a one-token source
    columns = preallocated_capacity(min(limit, m.max_positions - 1), m.max_positions)
    per_model = 6 * m.decoder_layers * columns * m.d_model + 2 * m.decoder_layers * m.d_model
    row = models * (element_bytes * per_model + 12 * vocab_size)
    tokens = int(GPU_MEMORY_SHARE * free // row)
    return {
        "tokens": max(BATCH_TOKENS, min(tokens, MAX_DEVICE_BATCH_TOKENS)),
        "free_gb": round(free / 2**30, 1),
        "rule": f"{GPU_MEMORY_SHARE} of the free memory, {row} bytes a budget token",
    }


def gpu_batch_budget(
    cfg: Config, device: torch.device, vocab_size: int, element_bytes: int, models: int
) -> dict | None:
    """The batch budget translation takes on `device` (`device_batch_tokens`, from the
    GPU memory free now), and logs; None on a CPU, or where the checkpoint's
    decode.batch_tokens is not the default (a budget someone chose)."""
    if device.type != "cuda" or cfg.decode.batch_tokens != BATCH_TOKENS:
        return None
    free, _ = torch.cuda.mem_get_info(device)
    budget = device_batch_tokens(cfg, vocab_size, free, element_bytes, models)
    log.info("batch budget on %s: %s", device, budget)
    return budget

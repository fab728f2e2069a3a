"""Decoding: greedy search over `model.decode_step` (pure).

All decoding choices (maximum length, minimum length) live here; the model only scores
one step. Sentences that finish leave the batch, so later steps do less work.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtkit.model import Transformer
from mtkit.tokenizer import BOS, EOS, PAD


def max_lengths(src_mask: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per-sentence output limit a * src_len + b, capped by the model's positions: (B,)."""
    src_len = src_mask.sum(dim=1).float()  # (B,)
    return (a * src_len + b).floor().long().clamp(min=1, max=limit - 1)  # (B,)


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, max_len_a: float = 1.2, max_len_b: int = 10,
                  min_len: int = 1) -> list[list[int]]:
    """src (B, S) -> for each sentence the argmax output ids, without bos/eos."""
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    limits = max_lengths(src_mask, max_len_a, max_len_b, model.cfg.max_positions)  # (B,)
    batch = src.size(0)
    out = torch.full((batch, int(limits.max())), PAD, dtype=torch.long, device=src.device)
    alive = torch.arange(batch, device=src.device)  # row of the shrinking batch -> sentence
    token = torch.full((batch,), BOS, dtype=torch.long, device=src.device)  # (b,)
    state = None
    step = 0
    while alive.numel():
        logits, state = model.decode_step(token, memory, src_mask, state)  # (b, V)
        logits[:, PAD] = float("-inf")
        logits[:, BOS] = float("-inf")
        if step < min_len:
            logits[:, EOS] = float("-inf")
        token = logits.argmax(dim=-1)  # (b,)
        out[alive, step] = token
        step += 1
        done = (token == EOS) | (step >= limits[alive])  # (b,)
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (b',)
            alive, token = alive[keep], token[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            state = state.index_select(keep)
    return [strip_specials(row) for row in out.tolist()]


def strip_specials(ids: list[int]) -> list[int]:
    """Cut at the first eos and drop padding."""
    if EOS in ids:
        ids = ids[: ids.index(EOS)]
    return [i for i in ids if i != PAD]

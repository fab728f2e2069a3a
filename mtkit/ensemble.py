"""Ensembles: several models that share their vocabularies, searched as one step model.

`Ensemble` is a `search.StepModel`: any search can run it. Each model keeps its own
decoder cache, and `EnsembleCache` carries them as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from mtkit.search import StepModel


@dataclass(frozen=True)
class EnsembleCache:
    """The decoder cache of each model of an ensemble (each keeps its own), used as one."""

    parts: tuple[Any, ...]

    def index_select(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache(tuple(c.index_select(rows, sentences) for c in self.parts))


class Ensemble:
    """Several models that share their vocabularies, searched as one step model: at each
    step the next-token log-probabilities are the mean of the models' log-probabilities
    (a log-linear ensemble, renormalized by the search), each model with its own cache.

    The models' memories lie side by side on the last axis, (B, S, D1 + D2 + ...), so
    that the search's row operations (repeat, select) move them together; the widths
    come from each model's `cfg.d_model`. One model's output is exactly its own: its
    logits pass through unchanged."""

    def __init__(self, models: list[StepModel]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)
        self.widths = [m.cfg.d_model for m in self.models]
        self.cfg = SimpleNamespace(max_positions=min(m.cfg.max_positions for m in self.models))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        encoded = [m.encode(src) for m in self.models]  # each (B, S, Di), (B, S)
        return torch.cat([memory for memory, _ in encoded], dim=-1), encoded[0][1]

    def decode_step(self, token: Tensor, memory: Tensor | None, src_mask: Tensor,
                    cache: EnsembleCache | None) -> tuple[Tensor, EnsembleCache]:
        memories = (memory.split(self.widths, dim=-1) if memory is not None  # (rows, S, Di)
                    else (None,) * len(self.models))  # after the first step
        caches = cache.parts if cache is not None else (None,) * len(self.models)
        outputs = [m.decode_step(token, mem, src_mask, c)
                   for m, mem, c in zip(self.models, memories, caches, strict=True)]
        new_cache = EnsembleCache(tuple(c for _, c in outputs))
        if len(outputs) == 1:
            return outputs[0][0], new_cache
        total = torch.log_softmax(outputs[0][0].float(), dim=-1)  # (rows, V)
        for logits, _ in outputs[1:]:
            total += torch.log_softmax(logits.float(), dim=-1)
        return total.div_(len(outputs)), new_cache  # the mean: (rows, V)

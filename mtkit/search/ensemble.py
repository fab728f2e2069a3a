"""Ensembles: several models that share their vocabularies, searched as one step model.

`Ensemble` is a `beam.StepModel` (any search can run it), and, when its models are
`Transformer`s, a model that `serving.stream` can stream: each model keeps its own
decoder cache, and `EnsembleCache` carries them as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from mtkit.search.beam import GROWING, StepModel, StepShapes, step_shapes
from mtkit.search.captured import FixedShapes


@dataclass(frozen=True)
class EnsembleCache:
    """The decoder cache of each model of an ensemble (each keeps its own), used as one:
    beam caches, which search reorders, or slot caches, which a stream fills, resizes and
    moves."""

    parts: tuple[Any, ...]

    def index_select(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache(tuple(c.index_select(rows, sentences) for c in self.parts))

    def preallocated(self, capacity: int) -> EnsembleCache:
        """Each model's cache preallocated for `capacity` positions (in fixed shapes)."""
        return EnsembleCache(tuple(c.preallocated(capacity) for c in self.parts))

    def fill(self, slots: Tensor, sources: tuple[Any, ...]) -> None:
        """`sources`: each model's, from `Ensemble.cross_kv`."""
        for cache, theirs in zip(self.parts, sources, strict=True):
            cache.fill(slots, theirs)

    def resized(self, slots: int, columns: int, source_capacity: int) -> EnsembleCache:
        return EnsembleCache(tuple(c.resized(slots, columns, source_capacity) for c in self.parts))

    def move(self, old: Tensor, new: Tensor) -> None:
        for cache in self.parts:
            cache.move(old, new)


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

    @property
    def step_shapes(self) -> StepShapes:
        """In fixed shapes (`beam.step_shapes`) where all its models step in them."""
        if all(step_shapes(m).fixed for m in self.models):
            return FixedShapes(self.cfg.max_positions)
        return GROWING

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        encoded = [m.encode(src) for m in self.models]  # each (B, S, Di), (B, S)
        return torch.cat([memory for memory, _ in encoded], dim=-1), encoded[0][1]

    def cross_kv(self, memory: Tensor) -> tuple[Any, ...]:
        """Each model's `cross_kv` of its part of memory (B, S, D1 + D2 + ...)."""
        return tuple(
            m.cross_kv(mem)
            for m, mem in zip(self.models, memory.split(self.widths, dim=-1), strict=True)
        )  # each (B, S, Di)

    def slot_cache(
        self,
        sources: tuple[Any, ...],
        slots: int,
        columns: int,
        source_capacity: int,
        fixed: bool = False,
    ) -> EnsembleCache:
        """Each model's free slots, for its `sources` (from `cross_kv`)."""
        return EnsembleCache(
            tuple(
                m.slot_cache(s, slots, columns, source_capacity, fixed)
                for m, s in zip(self.models, sources, strict=True)
            )
        )

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: EnsembleCache | None
    ) -> tuple[Tensor, EnsembleCache]:
        memories = (
            memory.split(self.widths, dim=-1)
            if memory is not None  # (rows, S, Di)
            else (None,) * len(self.models)
        )  # after the first step
        caches = cache.parts if cache is not None else (None,) * len(self.models)
        outputs = [
            m.decode_step(token, mem, src_mask, c)
            for m, mem, c in zip(self.models, memories, caches, strict=True)
        ]
        new_cache = EnsembleCache(tuple(c for _, c in outputs))
        if len(outputs) == 1:
            return outputs[0][0], new_cache
        total = torch.log_softmax(outputs[0][0].float(), dim=-1)  # (rows, V)
        for logits, _ in outputs[1:]:
            total += torch.log_softmax(logits.float(), dim=-1)
        return total.div_(len(outputs)), new_cache  # the mean: (rows, V)

"""Captured decoder steps: on a GPU, a search's steps replayed as CUDA graphs.

The one home of the fixed-shape mode of search. A decoder step launches hundreds of
small kernels; on a GPU the host's time to launch them can be most of the step. A CUDA
graph records a step's kernels once and replays them with one launch, but only on the
same tensors: the same shapes, at the same addresses. A `CapturedDecoder` says that it
steps in fixed shapes (its `step_shapes`: `FixedShapes`), and search then makes the
steps of a batch the same shapes (a `PreallocatedCache`, written in place, and sentences
that leave only at bucket boundaries); it keeps, for each shape it meets, a
step captured on tensors of its own (a `Slot`), copies a search's cache into them when
the search comes to that shape, and from then on the search runs on the slot's cache,
each step one replay.

    model = CapturedDecoder(transformer)        # a StepModel, as the transformer is
    beam_search(model, src, options)            # in fixed shapes, each step a replay

Off by default (`decode.cuda_graphs: off`): no GPU has yet measured it against eager
steps, and a search of a plain model never runs in fixed shapes.

On a CPU, a search's steps are compiled by Inductor in its own growing shapes instead
(`mtkit.search.compiled`, `--compile`): fixed shapes cost a CPU more than compiling wins.

`mtkit serve`'s stream of a model in fixed shapes (`serving.stream.GreedyStream`) steps
its slot cache (`SlotCache` with `fixed`: all slots, all columns) the same way: each step
a replay, until its capacities change.

A step that cannot be captured (its capture failed) runs eagerly on the cache it was
given and is counted (`eager_steps`); each reason for failing is logged once. A cache not in
fixed shapes (a `BeamCache`, a `SlotCache` that is not fixed) always steps eagerly. At
most `MAX_SLOTS` shapes are kept, the least recently used let go.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor

from mtkit.core.errors import first_line
from mtkit.core.vocab import BOS
from mtkit.model.cache import PreallocatedCache, SlotCache, preallocated_capacity
from mtkit.tuning.capture import CAPTURES, Capture

log = logging.getLogger(__name__)

FixedCache = PreallocatedCache | SlotCache  # a cache in fixed shapes (`fixed_shapes`)


class FixedShapes:
    """A search's batch in fixed shapes (a `beam.StepShapes`), as captured steps need:
    after the first step the cache is preallocated for the batch's longest output
    (`PreallocatedCache`, written in place), and rows that are done stay in the batch,
    masked, until at least half of them are (a bucket boundary), so that a batch of B
    sentences takes at most about log2(B) shapes."""

    fixed = True

    def __init__(self, max_positions: int):
        self.max_positions = max_positions

    def cache(self, cache: Any, longest: int) -> PreallocatedCache:
        return cache.preallocated(preallocated_capacity(longest, self.max_positions))

    def rows_leave(self, done: int, rows: int) -> bool:
        return 2 * done >= rows


# Slots kept at once, the least recently used let go first. A slot holds a cache of its
# shape (each layer's keys/values for every row and position) and its graph's memory:
# on a GPU their caches take at most `SLOT_MEMORY_SHARE` of its memory.
MAX_SLOTS = 16
SLOT_MEMORY_SHARE = 0.1


def slot_memory(device: torch.device) -> int | None:
    """The bytes a decoder's slots' caches may take on `device` (None: no bound)."""
    if device.type != "cuda":
        return None
    return int(SLOT_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory)


def shape_of(token: Tensor, src_mask: Tensor, cache: FixedCache) -> tuple:
    """What a captured step is specific to: its cache's shapes (and dtype: bf16 under
    autocast), its rows and source mask, and whether autocast is on."""
    return (
        cache.shape,
        token.size(0),
        *src_mask.shape,
        torch.is_autocast_enabled(token.device.type),
    )


class Slot:
    """One shape's captured step: its own token (R,), source mask (B, S) and cache, the
    step's output (R, D) on them, and the replay."""

    def __init__(self, model: Any, token: Tensor, src_mask: Tensor, like: FixedCache, capture):
        self.token = torch.full_like(token, BOS)  # (R,)
        self.src_mask = torch.ones_like(src_mask)  # (B, S)
        self.cache = like.blank()
        self.output: Tensor | None = None  # (R, D): where each replay writes

        def step() -> None:
            self.output, _ = model.decode_hidden(self.token, None, self.src_mask, self.cache)

        self.replay = capture(step)

    def run(self, token: Tensor, src_mask: Tensor) -> tuple[Tensor, FixedCache]:
        """One step of the slot's search: `token` (R,) and `src_mask` in (copied: a
        stream writes its mask in place as sentences join), the decoder's output out."""
        self.token.copy_(token)
        self.src_mask.copy_(src_mask)
        self.replay()
        return self.output, self.cache


class CapturedDecoder:
    """A `Transformer` (or anything with its `decode_hidden` and `project`) whose steps
    on a `PreallocatedCache` are replayed graphs, one `Slot` per shape; everything else
    is the model's. `capture` (default: the device's, `CAPTURES`) records a step."""

    def __init__(
        self,
        model: Any,
        capture: Capture | None = None,
        max_slots: int = MAX_SLOTS,
        max_bytes: int | None = None,
    ):
        self.model = model
        self.capture = capture
        self.max_slots = max_slots
        self.max_bytes = max_bytes  # of the slots' caches (None: `slot_memory`)
        # shape -> its slot, or None: that shape steps eagerly (its capture failed)
        self.slots: OrderedDict[tuple, Slot | None] = OrderedDict()
        self.replayed_steps = 0
        self.eager_steps = 0
        self.failures: dict[tuple, str] = {}
        self.log_failures = True  # one warning per reason (a measurement raises its own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @property
    def step_shapes(self) -> FixedShapes:
        """Searched in fixed shapes (`beam.step_shapes`), so that its steps replay."""
        return FixedShapes(self.model.cfg.max_positions)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any = None
    ) -> tuple[Tensor, Any]:
        y, cache = self.decode_hidden(token, memory, src_mask, cache)  # (R, D)
        return self.model.project(y), cache  # (R, V)

    def decode_hidden(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any = None
    ) -> tuple[Tensor, Any]:
        fixed = getattr(cache, "fixed_shapes", False)
        slot = self._slot(token, src_mask, cache) if fixed else None
        if slot is None:
            self.eager_steps += 1
            return self.model.decode_hidden(token, memory, src_mask, cache)
        if cache is not slot.cache:  # a search comes to this shape: its cache is the slot's
            slot.cache.load(cache)
        self.replayed_steps += 1
        y, cache = slot.run(token, src_mask)
        return y.clone(), cache  # the next replay writes over the slot's output

    def _slot(self, token: Tensor, src_mask: Tensor, cache: FixedCache) -> Slot | None:
        """The slot of this step's shape, captured on first meeting (None: eager)."""
        capture = self.capture or CAPTURES.get(token.device.type)
        if capture is None:
            return None
        key = shape_of(token, src_mask, cache)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        limit = self.max_bytes if self.max_bytes is not None else slot_memory(token.device)
        while self.slots and (
            len(self.slots) >= self.max_slots
            or (limit is not None and self.nbytes + cache.nbytes > limit)
        ):
            self.slots.popitem(last=False)  # the least recently used goes
        try:
            slot = Slot(self.model, token, src_mask, cache, capture)
        except Exception as e:  # noqa: BLE001 - any failure to capture means: step eagerly
            if self.log_failures and first_line(e) not in self.failures.values():
                log.warning("decoder steps of shape %s run eagerly: %s", key[:4], first_line(e))
            self.failures[key] = first_line(e)
            slot = None
        self.slots[key] = slot
        return slot

    @property
    def nbytes(self) -> int:
        """The bytes the slots' caches take."""
        return sum(s.cache.nbytes for s in self.slots.values() if s is not None)

    def record(self) -> dict:
        """What ran: steps replayed and eager, shapes captured, failures."""
        return {
            "replayed_steps": self.replayed_steps,
            "eager_steps": self.eager_steps,
            "shapes": sum(s is not None for s in self.slots.values()),
            "failed": len(self.failures),
        }

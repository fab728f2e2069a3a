"""One update as a captured CUDA graph, one graph per batch shape.

On a GPU the recipe's small model is host-bound: an eager update launches hundreds of
small kernels, one Python call each, and the GPU waits for the host most of an
update. A CUDA graph records the kernels of one whole update (forward, loss,
backward, per-token gradients and clipping, the non-finite check, AdamW) once, and
replays them with one launch. What the graph reads has to stay where it was recorded, so
each shape's update works on static buffers (`ShapeBuffers`): the batch is copied into
them, the token count and the learning rate are written into device scalars, and the
figures the loop keeps (losses, gradient norm, the non-finite flag) come out of device
tensors the graph writes. Nothing in `device_update` waits for the host: the loss is the
dense one (`output_and_loss(dense=True)`: pad rows masked, not removed), and a
non-finite update is skipped by the fused AdamW's `found_inf`.

A shape is captured at its first batch: two warm-up updates on a side stream with the
skip flag forced (they change no weight, no moment, no step count), then the capture,
which runs nothing; the RNG state is put back afterwards, so capturing draws nothing the
run sees and a resumed run, which captures its shapes at other moments, draws the same
dropout. A shape whose capture fails runs eagerly from then on (logged, and recorded in
metrics.jsonl), as do shapes beyond `max_graphs` (each graph keeps its activations'
memory). The whole mechanism is CUDA's; `capture` is injectable, so that the buffers and
the bookkeeping run on a CPU in tests with an eager stand-in for the graph.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mtkit.core.config import TrainConfig
from mtkit.core.device import autocast
from mtkit.core.errors import first_line
from mtkit.core.vocab import PAD
from mtkit.data.batching import Batch
from mtkit.model.loss import output_and_loss
from mtkit.training.optim import per_token_gradients, scale_per_token
from mtkit.tuning.capture import CAPTURES, Capture, UpdateMeasure

log = logging.getLogger(__name__)

MAX_GRAPHS = 32  # shapes captured at most; later new shapes run eagerly


@dataclass
class Figures:
    """What one update leaves on the device for the loop (`loop.Window`)."""

    loss: torch.Tensor  # () summed over the target tokens
    nll: torch.Tensor
    grad_norm: torch.Tensor  # () before clipping
    nonfinite: torch.Tensor  # () bool: the update was skipped


@dataclass
class ShapeBuffers:
    """The static inputs of one batch shape's update."""

    batch: Batch  # src (B, S), tgt_in (B, T), tgt_out (B, T) on the device
    tokens: torch.Tensor  # () float: the batch's target tokens
    lr: torch.Tensor  # () float: this update's learning rate
    force_skip: torch.Tensor  # () bool: warm-up updates are skipped whatever their gradients

    @classmethod
    def like(cls, batch: Batch, device: torch.device) -> ShapeBuffers:
        def scalar(dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros((), dtype=dtype, device=device)

        return cls(
            batch.to(device), scalar(torch.float32), scalar(torch.float32), scalar(torch.bool)
        )

    def fill(self, batch: Batch, tokens: int, lr: float) -> None:
        """Copy a batch of this shape (on the host, pinned where it can be) and the
        update's scalars in: asynchronous copies and fills, no wait."""
        for static, new in zip(
            (self.batch.src, self.batch.tgt_in, self.batch.tgt_out),
            (batch.src, batch.tgt_in, batch.tgt_out),
            strict=True,
        ):
            static.copy_(new, non_blocking=True)
        self.tokens.fill_(float(tokens))
        self.lr.fill_(lr)


def device_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    buffers: ShapeBuffers,
    tc: TrainConfig,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> Figures:
    """One whole update from the static buffers, without a host sync: forward and the
    dense loss, backward, per-token gradients clipped to `clip_norm`
    (`optim.scale_per_token`), the non-finite flag (or the forced skip), AdamW at the
    buffered rate. The gradients are None before and after (`set_to_none`): inside a
    graph they live in its memory pool only."""
    with autocast(device, autocast_dtype):
        out = output_and_loss(
            model(buffers.batch.src, buffers.batch.tgt_in),
            buffers.batch.tgt_out,
            tc.label_smoothing,
            dense=True,
        )
    out.loss.backward()
    norm = scale_per_token(model, buffers.tokens.clamp(min=1.0), tc.clip_norm)
    nonfinite = ~torch.isfinite(norm) | buffers.force_skip
    optimizer.found_inf = nonfinite.float()
    for group in optimizer.param_groups:
        group["lr"] = buffers.lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return Figures(out.loss.detach(), out.nll.detach(), norm.detach(), nonfinite)


class CapturedUpdates:
    """Every batch shape's update as a graph (`device_update`, captured by `capture`),
    replayed for each batch of its shape. `run` returns None for a shape that runs
    eagerly (its capture failed, or `max_graphs` are taken): the loop's eager update
    then takes that batch."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        tc: TrainConfig,
        device: torch.device,
        autocast_dtype: torch.dtype | None,
        capture: Capture | None = None,
        max_graphs: int = MAX_GRAPHS,
        on_fallback: Callable[[tuple, str], None] | None = None,
    ):
        self.model, self.optimizer, self.tc = model, optimizer, tc
        self.device, self.autocast_dtype = device, autocast_dtype
        self.capture = capture or CAPTURES[device.type]
        self.max_graphs, self.on_fallback = max_graphs, on_fallback
        # shape -> (buffers, replay, figures), or None: that shape runs eagerly
        self.graphs: dict[tuple, tuple[ShapeBuffers, Callable[[], None], list] | None] = {}

    @staticmethod
    def shape(batch: Batch) -> tuple:
        return (*batch.src.shape, *batch.tgt_in.shape)

    @property
    def captured(self) -> int:
        return sum(g is not None for g in self.graphs.values())

    def run(self, batch: Batch, lr: float) -> tuple[Figures, int] | None:
        """The update of `batch` (on the host) at rate `lr` by its shape's graph:
        (figures on the device, target tokens); None where the shape runs eagerly."""
        key = self.shape(batch)
        if key not in self.graphs:
            self.graphs[key] = self._captured(batch, key)
        graph = self.graphs[key]
        if graph is None:
            return None
        buffers, replay, figures = graph
        tokens = int((batch.tgt_out != PAD).sum())  # on the host: the batch is still there
        buffers.fill(batch, tokens, lr)
        replay()
        for group in self.optimizer.param_groups:
            group["lr"] = lr  # the float again, as the eager update and checkpoints have it
        return figures[0], tokens

    def _captured(self, batch: Batch, key: tuple):
        if self.captured >= self.max_graphs:
            return self._eager(key, f"{self.max_graphs} shapes are captured already")
        buffers = ShapeBuffers.like(batch, self.device)
        buffers.force_skip.fill_(True)  # warm-up updates change nothing
        figures: list[Figures] = []

        def update() -> None:
            figures[:] = [
                device_update(
                    self.model, self.optimizer, buffers, self.tc, self.device, self.autocast_dtype
                )
            ]

        rng = _rng_state(self.device)
        capturable = [group.get("capturable", False) for group in self.optimizer.param_groups]
        try:
            for group in self.optimizer.param_groups:  # (AdamW checks it under capture)
                group["capturable"] = self.device.type == "cuda"
            replay = self.capture(update)
        except RuntimeError as e:  # what cannot be captured runs eagerly
            self.optimizer.zero_grad(set_to_none=True)
            return self._eager(key, f"{type(e).__name__}: {first_line(e)}")
        finally:
            for group, was in zip(self.optimizer.param_groups, capturable, strict=True):
                group["capturable"] = was
            _set_rng_state(self.device, rng)
        buffers.force_skip.fill_(False)
        log.debug("captured the update of batch shape %s as a graph", key)
        return buffers, replay, figures

    def _eager(self, key: tuple, why: str) -> None:
        log.warning("batch shape %s runs eagerly: %s", key, why)
        if self.on_fallback is not None:
            self.on_fallback(key, why)
        return None


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def eager_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    tc: TrainConfig,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> None:
    """An update as the loop runs it eagerly (one batch), for timing: the loss with its
    host sync, backward, `per_token_gradients`, AdamW."""
    batch = batch.to(device, non_blocking=True)
    with autocast(device, autocast_dtype):
        out = output_and_loss(model(batch.src, batch.tgt_in), batch.tgt_out, tc.label_smoothing)
    out.loss.backward()
    per_token_gradients(model, out.tokens, tc.clip_norm, device, distributed=False)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_timer(
    model: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    batch: Batch,
    tc: TrainConfig,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    updates: int = 10,
) -> UpdateMeasure:
    """A measure of `updates` updates of a copy of `model` (its own optimizer) on
    `batch`, eagerly (`eager_update`) and replayed (`CapturedUpdates`),
    each timed between two device synchronisations, the faster of two rounds. The
    run's RNG streams are left as they were."""

    def measure() -> tuple[float, float]:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            twin = copy.deepcopy(model)
            optimizer = make_optimizer(twin)
            captured = CapturedUpdates(twin, optimizer, tc, device, autocast_dtype)

            def timed(step: Callable[[], object]) -> float:
                step()  # (a capture, or warm caches)
                best = float("inf")
                for _ in range(2):
                    _synchronize(device)
                    start = time.perf_counter()
                    for _ in range(updates):
                        step()
                    _synchronize(device)
                    best = min(best, (time.perf_counter() - start) / updates)
                return best

            eager = timed(lambda: eager_update(twin, optimizer, batch, tc, device, autocast_dtype))
            if captured.run(batch, tc.lr) is None:  # could not capture: eager it is
                return eager, float("inf")
            return eager, timed(lambda: captured.run(batch, tc.lr))

    return measure


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""A training run's measured choices (precision, attention kernel, batch shapes, CUDA
graphs), each decided once.

A choice that depends on the machine is decided at a run's first start: the config asks
for a value, or for `auto`, which measures; the decision is stored in every checkpoint
and in metrics.jsonl's `start` record. A resumed run reuses it and never measures again:
a second measurement on a busy machine could switch the choice mid-run, and the run would
no longer be the one that never stopped. A resume whose config asks for another value is
refused. Under DDP every rank takes rank 0's choice. `decided_once` is that sequence,
once for every choice; a `RunChoice` says how one choice is named, stored and measured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mtkit.core.config import Config
from mtkit.core.device import cpu_description
from mtkit.core.errors import TrainError
from mtkit.data.batching import Batch, BatchShapes
from mtkit.data.shards import ShardDataset
from mtkit.model.transformer import Transformer
from mtkit.tuning.attention import AttentionShape, choose_attention
from mtkit.tuning.capture import UpdateMeasure, choose_graphs
from mtkit.tuning.precision import calibration_shape, precision_record, resolve_precision
from mtkit.tuning.shapes import choose_batch_shapes

log = logging.getLogger("mtkit.training.loop")  # training's lines: they read "mtkit.training.loop"


@dataclass(frozen=True)
class Decision:
    """One run choice as decided: the value the run uses, what the config asked for, and
    the rest of its stored record (the measurement behind `auto`, the machine it was
    measured on, what the value brings with it)."""

    value: str  # e.g. "bf16", "matmul", "classes"
    asked: str  # "auto" or a value
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunChoice:
    """How one measured choice is named, stored and refused."""

    name: str  # in log lines: "precision"
    key: str  # the config key that asks for it: "train.precision"
    stored_as: str  # the stored record's key for the value: "precision"
    values: tuple[str, ...]  # what it can choose (rank 0's is broadcast by position)
    trained: str = "with {key}={value}"  # "<checkpoint> was trained ..."

    def record(self, decision: Decision) -> dict:
        """The stored form: {stored_as: value, "asked": ..., **details}."""
        return {self.stored_as: decision.value, "asked": decision.asked, **decision.details}

    def decision(self, record: dict) -> Decision:
        details = {k: v for k, v in record.items() if k not in (self.stored_as, "asked")}
        value = record[self.stored_as]
        return Decision(value, record.get("asked", value), details)

    def refusal(self, source: Path, stored: Decision, asked: str) -> str:
        trained = self.trained.format(key=self.key, value=stored.value)
        said = asked if self.key in trained else f"{self.key}={asked}"
        return (
            f"{source} was trained {trained}, the config says {said}; resume with "
            f"{self.key}={stored.value} (or auto), or start over with --no-resume"
        )


PRECISION = RunChoice(
    "precision", "train.precision", "precision", ("fp32", "bf16"), trained="in {value}"
)
ATTENTION = RunChoice("attention", "train.attention", "kernel", ("sdpa", "matmul"))
BATCH_SHAPES = RunChoice("batch shapes", "train.batch_shapes", "shapes", ("exact", "classes"))
CUDA_GRAPHS = RunChoice("CUDA graphs", "train.cuda_graphs", "graphs", ("on", "off"))


def decided_once(
    choice: RunChoice,
    asked: str,
    found: tuple[Path, dict] | None,
    measure: Callable[[], Decision],
    broadcast: torch.device | None = None,
) -> Decision:
    """The run's decision for `choice`: the stored one when resuming (`found`: the
    checkpoint's path and the choice's stored record), refused if the config asks for
    another value; else `measure()`'s, with rank 0's value taken by every rank under DDP
    (`broadcast`: the device the ranks' collectives run on), since each rank's measurement
    may differ."""
    if found is not None:
        source, record = found
        stored = choice.decision(record)
        log.info(
            "%s %s, as decided at this run's first start (%s); not measured again",
            choice.name,
            stored.value,
            _measured(stored),
        )
        if asked not in ("auto", stored.value):
            raise TrainError(choice.refusal(source, stored, asked))
        return stored
    decision = measure()
    if broadcast is not None:
        chosen = torch.tensor([choice.values.index(decision.value)], device=broadcast)
        dist.broadcast(chosen, 0)
        decision = replace(decision, value=choice.values[int(chosen.item())])
    return decision


def _measured(decision: Decision) -> str:
    """'fp32 10.8 ms, bf16 2.9 ms' from a stored record's timings, or what was asked."""
    found = {**decision.details, **decision.details.get("calibration", {})}
    timings = [
        f"{k.removesuffix('_ms').replace('_', ' ')} {v} ms"
        for k, v in found.items()
        if k.endswith("_ms")
    ]
    return ", ".join(timings) or f"asked for {decision.asked}"


@dataclass(frozen=True)
class RunChoices:
    """Every measured choice of a run. Stored (`as_record`) as mtkit has always stored
    them: the precision's record, holding the attention's and the batch shapes'."""

    precision: Decision
    attention: Decision
    batches: Decision
    graphs: Decision = Decision("off", "off")  # until `graphs_choice` decides

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision.value == "bf16" else None

    def as_record(self) -> dict:
        return {
            **PRECISION.record(self.precision),
            "attention": ATTENTION.record(self.attention),
            "batches": BATCH_SHAPES.record(self.batches),
            "graphs": CUDA_GRAPHS.record(self.graphs),
        }


def stored_choices(found: tuple[Path, dict] | None) -> dict[str, tuple[Path, dict]]:
    """For `decided_once`: each choice's stored record in a checkpoint; empty for a fresh
    run."""
    if found is None:
        return {}
    path, payload = found
    top = payload["train"]["precision"]
    precision = {k: v for k, v in top.items() if k not in ("attention", "batches", "graphs")}
    return {
        "precision": (path, precision),
        "attention": (path, top["attention"]),
        "batches": (path, top["batches"]),
        "graphs": (path, top["graphs"]),
    }


def run_attention_shape(cfg: Config, train_data: ShardDataset) -> AttentionShape:
    """The attention a run computes most: batches of `max_tokens` of its targets' mean
    length."""
    mean_length = float(np.mean(train_data.tgt_lengths)) + 1 if len(train_data) else 16.0
    model = cfg.model
    return AttentionShape.of_run(cfg.train.max_tokens, mean_length, model.d_model, model.heads)


def run_choices(
    cfg: Config,
    device: torch.device,
    found: tuple[Path, dict] | None,
    train_data: ShardDataset,
    distributed: bool = False,
) -> RunChoices:
    """The run's precision, attention kernel and batch shapes, each `decided_once`."""
    tc, model = cfg.train, cfg.model
    stored = stored_choices(found)
    broadcast = device if distributed else None
    linear = calibration_shape(tc.max_tokens, model.d_model, model.ffn_dim)

    def measure_precision() -> Decision:
        dtype, calibration = resolve_precision(tc.precision, device, linear)
        record = precision_record(dtype, tc.precision, calibration)
        record["cpu"] = cpu_description() if device.type == "cpu" else str(device)
        return PRECISION.decision(record)

    precision = decided_once(
        PRECISION, tc.precision, stored.get("precision"), measure_precision, broadcast
    )
    dtype = torch.bfloat16 if precision.value == "bf16" else None

    shape = run_attention_shape(cfg, train_data)

    def measure_attention() -> Decision:
        return ATTENTION.decision(choose_attention(tc.attention, device, dtype, shape))

    attention = decided_once(
        ATTENTION, tc.attention, stored.get("attention"), measure_attention, broadcast
    )

    def measure_batches() -> Decision:
        if tc.batch_shapes == "auto" and graphs_possible(cfg, device, distributed):
            # A graph per shape: hundreds of token-bucketed shapes would each be captured.
            return Decision("classes", "auto", {"why": "CUDA graphs want few shapes"})
        return BATCH_SHAPES.decision(
            choose_batch_shapes(
                tc.batch_shapes,
                device,
                dtype,
                linear,
                fresh_above=tc.max_tokens,
                attention=(attention.value, shape),
            )
        )

    batches = decided_once(
        BATCH_SHAPES, tc.batch_shapes, stored.get("batches"), measure_batches, broadcast
    )
    if batches.value == "classes" and "multiple" not in batches.details:
        shapes = BatchShapes()  # stored, so that a later mtkit resumes on the same batches
        batches = replace(
            batches, details={**batches.details, "multiple": shapes.multiple, "group": shapes.group}
        )
    return RunChoices(precision, attention, batches)


def graphs_possible(cfg: Config, device: torch.device, distributed: bool) -> bool:
    """Whether `train.cuda_graphs` may take graphs on this run (`choose_graphs`)."""
    if cfg.train.cuda_graphs == "off":
        return False
    return "why" not in choose_graphs("on", device, cfg.train, distributed, None)


def graphs_choice(
    cfg: Config,
    device: torch.device,
    found: tuple[Path, dict] | None,
    distributed: bool,
    model: Transformer,
    train_data: ShardDataset,
    update_timer: Callable[[Batch], UpdateMeasure],
) -> Decision:
    """The run's `train.cuda_graphs`, `decided_once` like the others once the model is
    built; `auto` times updates (`update_timer`: training's, of a copy of `model`, in the
    precision chosen) on a random batch of the run's typical shape (`run_attention_shape`)."""
    tc = cfg.train

    def measure() -> Decision:
        shape = run_attention_shape(cfg, train_data)
        vocab = min(e.tokens.num_embeddings for e in (model.src_embed, model.tgt_embed))
        ids = torch.randint(4, vocab, (shape.batch, shape.length))  # (both sides' pieces)
        timer = update_timer(Batch(ids, ids, ids))
        return CUDA_GRAPHS.decision(choose_graphs(tc.cuda_graphs, device, tc, distributed, timer))

    stored = stored_choices(found).get("graphs")
    broadcast = device if distributed else None
    return decided_once(CUDA_GRAPHS, tc.cuda_graphs, stored, measure, broadcast)


def batch_shapes(decision: Decision, max_positions: int | None = None) -> BatchShapes | None:
    """The `BatchShapes` a run's decision asks for (its own multiple and run length, so
    that a later mtkit resumes on the same batches), no wider than the model's positions;
    None for token batches."""
    if decision.value != "classes":
        return None
    default = BatchShapes()
    return BatchShapes(
        decision.details.get("multiple", default.multiple),
        decision.details.get("group", default.group),
        max_positions,
    )

"""The state of one training run (`TrainState`), and `setup`, which builds it: fresh, or
resumed from the newest intact checkpoint.

A resumed run must be the same run: the checkpoint's model config, shards and tokenizer
are the run's, or it is refused (`TrainError`), and it keeps the choices measured at its
first start (`decided_once`: precision, attention kernel, batch shapes). The checkpoint
gives back the weights, the optimizer, the RNG streams and the `Progress` (step, epoch,
batch within the epoch), so that training goes on exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from mtkit.core.checkpoint import (
    SHORTLIST,
    CheckpointError,
    check_shortlist,
    describe_weights,
    find_resumable,
    load_checkpoint,
    load_tensors,
    trained_model,
)
from mtkit.core.config import Config, ModelConfig, config_from_dict, config_to_dict, save_config
from mtkit.core.configcheck import ConfigError
from mtkit.core.device import (
    calibration_shape,
    cpu_description,
    precision_record,
    resolve_device,
    resolve_precision,
)
from mtkit.core.errors import UserError, plural
from mtkit.core.languages import epoch_counts, output_vocabularies, tag_ids
from mtkit.core.signals import held_while_starting_workers
from mtkit.core.vocab import Vocab, entry_vocabs, load_vocabs
from mtkit.data.alignments import AlignedShards
from mtkit.data.batching import Batch, BatchShapes, TokenBatchSampler, make_loader
from mtkit.data.shards import ShardDataset
from mtkit.model.kernel_timing import AttentionShape, choose_attention, choose_batch_shapes
from mtkit.model.transformer import Transformer, build_model, count_parameters, guided_attention
from mtkit.search.captured import CapturedDecoder, graph_choice
from mtkit.training.graphs import CapturedUpdates, choose_graphs, update_timer
from mtkit.training.metrics_log import MetricsLog
from mtkit.training.optim import adamw

log = logging.getLogger("mtkit.training.loop")  # one stage: its lines read "mtkit.training.loop"


class TrainError(UserError, RuntimeError):
    """A training run that cannot start or go on (one line)."""


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    batch: int = 0  # batches of `epoch` already consumed (this rank)
    best_bleu: float = -1.0
    bad_validations: int = 0
    elapsed: float = 0.0  # seconds of training, over all sessions
    early_stopped: bool = False  # patience ran out: resuming changes nothing


@dataclass
class TrainState:
    """Everything one training run works on, built once by `setup`."""

    cfg: Config
    model: Transformer
    wrapped: nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    progress: Progress
    batches: Iterator[tuple[int, int, Batch]]  # endless (epoch, index in epoch, batch)
    sampler: TokenBatchSampler  # `epoch_size(epoch)`: this rank's batches in an epoch
    vocabs: tuple[Vocab, Vocab]
    train_data: ShardDataset
    valid_data: ShardDataset | None
    device: torch.device
    choices: RunChoices  # precision, attention kernel, batch shapes: decided at the first start
    metrics: MetricsLog
    rank: int
    world: int
    clock_start: float  # perf_counter() at which `progress.elapsed` would have been 0
    saved_step: int  # the step of the newest checkpoint
    captured: CapturedUpdates | None = None  # each shape's update as a graph (cuda_graphs)
    # a distilled student's lexical shortlist (RUN/distill/shortlist.pt, checked at the
    # start: `student_shortlist`), kept in each checkpoint
    shortlist: dict[str, Tensor] | None = None
    # validation's decoder steps as graphs (decode.cuda_graphs), kept from one validation
    # to the next: the optimizer writes the weights in place, where the graphs read them
    decoder: CapturedDecoder | None = None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self.choices.autocast_dtype

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(cfg: Config, resume: bool) -> TrainState:
    """Check the run's data, build the model and optimizer, resume from the newest intact
    checkpoint when asked, and open the batch stream at the saved position."""
    source = init_checkpoint(cfg.train.init_from) if cfg.train.init_from else None
    cfg = init_model_config(cfg, source)
    tc, run = cfg.train, cfg.run_path
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    device = resolve_device(tc.device)
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    vocabs = load_vocabs(run, cfg.tokenizer.joint)
    shortlist = student_shortlist(cfg, vocabs)  # now, not at the first checkpoint
    train_data, valid_data = _open_data(cfg, vocabs)
    found = find_resumable(run / "checkpoints") if resume else None
    if distributed:
        _same_start_on_every_rank(found, run)
    if found is not None:  # refused before anything is decided or logged
        _check_same_model(cfg, found[1], found[0])
        _check_same_data(found[1], found[0], train_data, vocabs)
    choices = run_choices(cfg, device, found, train_data, distributed)

    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, len(vocabs[0]), len(vocabs[1])).to(device)
    if source is not None and found is None:
        _init_weights(cfg, source, model, vocabs)
    freeze(model, tc.freeze)
    model.use_attention(choices.attention.value)
    if tc.guided_alignment:  # the head that learns the alignments (`batch_loss`)
        guided_attention(model).guided_head = 0
    optimizer = adamw(model, tc, device)
    graphs = graphs_choice(cfg, device, found, distributed, model, train_data, choices)
    choices = replace(choices, graphs=graphs)
    metrics = _open_metrics(cfg, rank)
    progress = _resume(cfg, found, resume, model, optimizer, train_data, vocabs, rank, world)
    if rank == 0:
        save_config(cfg, run / "config.yaml")
        log.info(
            "model: %s parameters; device %s, %s; %d rank(s)",
            f"{count_parameters(model):,}",
            device,
            "bf16 autocast" if choices.autocast_dtype else "fp32",
            world,
        )
        metrics.write(
            "start",
            step=progress.step,
            parameters=count_parameters(model),
            device=str(device),
            world_size=world,
            resumed=found is not None,
            **choices.as_record(),
        )
    wrapped: nn.Module = model
    if distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    wrapped.train()
    sampler = TokenBatchSampler(
        train_data.src_lengths,
        train_data.tgt_lengths,
        tc.max_tokens,
        seed=tc.seed,
        rank=rank,
        world_size=world,
        draws=direction_draws(train_data, cfg.data.temperature),
        shapes=batch_shapes(choices.batches, cfg.model.max_positions),
    )
    batches = _batches_from(
        sampler, train_data, progress, cfg.data.loader_workers, pin=device.type == "cuda"
    )
    sampler.set_epoch(progress.epoch)  # (the stream starts it at the saved batch)
    return TrainState(
        cfg,
        model,
        wrapped,
        optimizer,
        progress,
        batches,
        sampler,
        vocabs,
        train_data,
        valid_data,
        device,
        choices,
        metrics,
        rank,
        world,
        clock_start=time.perf_counter() - progress.elapsed,
        saved_step=progress.step,
        captured=_captured_updates(cfg, choices, model, optimizer, device, metrics),
        decoder=(
            CapturedDecoder(model)
            if graph_choice(cfg.decode.cuda_graphs, device)["graphs"] == "on"
            else None
        ),
        shortlist=shortlist,
    )


def student_shortlist(cfg: Config, vocabs: tuple[Vocab, Vocab]) -> dict[str, Tensor] | None:
    """A distilled student's lexical shortlist, RUN/distill/shortlist.pt (`mtkit distill`
    writes it with `distill.shortlist` > 0), checked against the run's vocabularies
    (`check_shortlist`); None without `distill.teacher` or with `distill.shortlist: 0`.
    Missing or unusable, it is one `TrainError` before the first step, not at the first
    checkpoint."""
    if not cfg.distill.teacher or not cfg.distill.shortlist:
        return None
    path = cfg.run_path / SHORTLIST
    remedy = "rerun `mtkit distill` to make it again"
    if not path.is_file():
        raise TrainError(
            f"distill.shortlist is {cfg.distill.shortlist} but {path} is "
            f"{'not a file' if path.exists() else 'missing'}; {remedy} "
            f"(or set distill.shortlist=0 for a student without one)"
        )
    try:
        entry = load_tensors(path)
        check_shortlist(entry, len(vocabs[0]), len(vocabs[1]), path, remedy)
    except CheckpointError as e:
        message = str(e)
        raise TrainError(message if remedy in message else f"{message}; {remedy}") from None
    return entry


def _captured_updates(
    cfg: Config,
    choices: RunChoices,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    metrics: MetricsLog,
) -> CapturedUpdates | None:
    """Where the run takes CUDA graphs: the updates that capture and replay them, each
    shape that falls back to eager updates written to metrics.jsonl (`graph_fallback`)."""
    if choices.graphs.value != "on" or cfg.train.guided_alignment:
        return None  # (guided alignment's loss is not in the captured update)
    if not graphs_possible(cfg, device, dist.is_initialized()):
        return None  # (a run that took graphs, resumed where they cannot run)

    def fell_back(shape: tuple, why: str) -> None:
        metrics.write("graph_fallback", shape=list(shape), why=why)

    return CapturedUpdates(
        model, optimizer, cfg.train, device, choices.autocast_dtype, on_fallback=fell_back
    )


def direction_draws(data: ShardDataset, temperature: float) -> list[tuple[np.ndarray, int]]:
    """What each epoch draws from each direction under `data.temperature` (its pair
    indices and how many: `languages.epoch_counts`); [] (every pair once) for one
    direction or a temperature of 1."""
    groups = data.directions()
    if len(groups) < 2 or temperature == 1.0:
        return []
    counts = epoch_counts({d: len(ix) for d, ix in groups.items()}, temperature)
    log.info(
        "temperature %g: an epoch draws %s",
        temperature,
        ", ".join(f"{d} {counts[d]:,} of {len(ix):,}" for d, ix in groups.items()),
    )
    return [(ix, counts[d]) for d, ix in groups.items()]


def _open_data(
    cfg: Config, vocabs: tuple[Vocab, Vocab]
) -> tuple[ShardDataset, ShardDataset | None]:
    """The run's train shard (and valid, when there is one), checked against the
    tokenizer and their checksums; every training pair must fit the model's positions.
    The pieces each target language's text uses go into the target vocabulary, which
    checkpoints save (`languages.output_vocabularies`)."""
    folder = cfg.run_path / "data"
    train_data = ShardDataset(folder / "train")
    valid_data = ShardDataset(folder / "valid") if (folder / "valid").exists() else None
    for data in (train_data, valid_data):
        if data is not None:
            data.check_tokenizer(*vocabs)
            data.verify()
    if cfg.train.guided_alignment:  # its pairs carry their links (`mtkit.data.alignments`)
        train_data = AlignedShards(train_data)
    _check_positions(cfg, train_data)
    vocabs[1].languages = output_vocabularies(
        train_data,
        cfg.data,
        len(vocabs[1]),
        vocabs[0].same(vocabs[1]),
        tag_ids(vocabs[1], cfg.data),
    )
    return train_data, valid_data


def _open_metrics(cfg: Config, rank: int) -> MetricsLog:
    """RUN/metrics.jsonl on rank 0, with TensorBoard when `train.tensorboard` asks for it;
    a log that writes nothing on the other ranks."""
    if rank != 0:
        return MetricsLog(None)
    board = None
    if cfg.train.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrainError(
                "train.tensorboard needs TensorBoard: pip install 'mtkit[tensorboard]'"
            ) from None
        board = SummaryWriter(str(cfg.run_path / "tensorboard"))
    return MetricsLog(cfg.run_path / "metrics.jsonl", board)


# --- measured run choices, decided once -------------------------------------------------
#
# A choice that depends on the machine (the precision, the attention kernel, the batches'
# shapes) is decided at a run's first start: the config asks for a value, or for `auto`,
# which measures; the decision is stored in every checkpoint and in metrics.jsonl's `start`
# record. A resumed run reuses it and never measures again: a second measurement on a busy
# machine could switch the choice mid-run, and the run would no longer be the one that
# never stopped. A resume whose config asks for another value is refused. Under DDP
# every rank takes rank 0's choice. `decided_once` is that sequence, once for every
# choice; a `RunChoice` says how one choice is named, stored and measured.


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
    # What a checkpoint from before the choice existed ran with (None: decide it now).
    before: Decision | None = None

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
# Batches of a checkpoint from before train.batch_shapes were token batches: resuming on
# others would change which batch its saved position names.
BATCH_SHAPES = RunChoice(
    "batch shapes",
    "train.batch_shapes",
    "shapes",
    ("exact", "classes"),
    before=Decision("exact", "exact"),
)


# A checkpoint from before train.cuda_graphs trained with eager updates.
CUDA_GRAPHS = RunChoice(
    "CUDA graphs", "train.cuda_graphs", "graphs", ("on", "off"), before=Decision("off", "off")
)


def decided_once(
    choice: RunChoice,
    asked: str,
    found: tuple[Path, dict | None] | None,
    measure: Callable[[], Decision],
    broadcast: torch.device | None = None,
) -> Decision:
    """The run's decision for `choice`: the stored one when resuming (`found`: the
    checkpoint's path and the choice's stored record, None where the checkpoint predates
    the choice), refused if the config asks for another value; else `measure()`'s, with
    rank 0's value taken by every rank under DDP (`broadcast`: the device the ranks'
    collectives run on), since each rank's measurement may differ."""
    if found is not None:
        source, record = found
        if record is not None:
            stored = choice.decision(record)
            log.info(
                "%s %s, as decided at this run's first start (%s); not measured again",
                choice.name,
                stored.value,
                _measured(stored),
            )
        elif choice.before is not None:
            stored = choice.before
            log.warning(
                "%s does not say which %s it was trained with (an older mtkit): %s=%s",
                source,
                choice.name,
                choice.key,
                stored.value,
            )
        else:
            stored = None
            log.warning(
                "%s does not say which %s it was trained with (an older mtkit); deciding it now",
                source,
                choice.name,
            )
        if stored is not None:
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
    graphs: Decision = CUDA_GRAPHS.before

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


def stored_choices(found: tuple[Path, dict] | None) -> dict[str, tuple[Path, dict | None]]:
    """For `decided_once`: each choice's stored record in a checkpoint (None where the
    checkpoint predates it); empty for a fresh run."""
    if found is None:
        return {}
    path, payload = found
    top = payload["train"].get("precision")
    if top is None:
        return {name: (path, None) for name in ("precision", "attention", "batches", "graphs")}
    precision = {k: v for k, v in top.items() if k not in ("attention", "batches", "graphs")}
    return {
        "precision": (path, precision),
        "attention": (path, top.get("attention")),
        "batches": (path, top.get("batches")),
        "graphs": (path, top.get("graphs")),
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
    choices: RunChoices,
) -> Decision:
    """The run's `train.cuda_graphs`, `decided_once` like the others once the model is
    built; `auto` times updates of a copy of `model` on a random batch of the run's
    typical shape (`run_attention_shape`), in the precision chosen."""
    tc = cfg.train

    def measure() -> Decision:
        shape = run_attention_shape(cfg, train_data)
        vocab = min(e.tokens.num_embeddings for e in (model.src_embed, model.tgt_embed))
        ids = torch.randint(4, vocab, (shape.batch, shape.length))  # (both sides' pieces)
        batch = Batch(ids, ids, ids)
        timer = update_timer(
            model, lambda m: adamw(m, tc, device), batch, tc, device, choices.autocast_dtype
        )
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


def init_model_config(cfg: Config, source: Path | None) -> Config:
    """With `train.init_from`, the run's model section is the checkpoint's, but for the
    dropout rates (training settings: this config's) and the layer counts, where
    `train.init_encoder_layers` / `init_decoder_layers` choose some of its layers.
    `source`: that checkpoint (`init_checkpoint`), None without init_from."""
    tc = cfg.train
    if source is None:
        for side in ("encoder", "decoder"):
            if getattr(tc, f"init_{side}_layers"):
                raise ConfigError(
                    f"train.init_{side}_layers chooses layers of train.init_from, which is not set"
                )
        return cfg
    theirs = config_from_dict(load_checkpoint(source, mmap=True)["config"], str(source)).model
    counts = {}
    for side in ("encoder", "decoder"):
        chosen, have = getattr(tc, f"init_{side}_layers"), getattr(theirs, f"{side}_layers")
        wrong = [i for i in chosen if not 0 <= i < have]
        if wrong:
            raise TrainError(
                f"train.init_{side}_layers: {source} has {plural(have, f'{side} layer')} "
                f"(0 to {have - 1}), not {wrong[0]}"
            )
        if chosen:
            counts[f"{side}_layers"] = len(chosen)
    return replace(
        cfg,
        model=replace(
            theirs,
            dropout=cfg.model.dropout,
            attention_dropout=cfg.model.attention_dropout,
            **counts,
        ),
    )


def init_checkpoint(init_from: str) -> Path:
    """`train.init_from` as a checkpoint file: as given, or a run directory's final model."""
    path = Path(init_from)
    if path.is_dir():
        # Without the run's lock, which each rank of a distributed run would ask for at
        # once: average.pt is written atomically, so ranks that average together each
        # leave the same whole file.
        model = trained_model(path)
        if model is None:
            raise TrainError(f"train.init_from: {init_from} has no trained model yet")
        return model
    if not path.is_file():
        raise TrainError(f"train.init_from: {init_from}: no such checkpoint or run directory")
    return path


def chosen_layers(
    weights: dict[str, Tensor], encoder: tuple[int, ...], decoder: tuple[int, ...]
) -> dict[str, Tensor]:
    """A model's weights with only the chosen layers of each stack (indices; empty: all),
    renumbered from 0 in the order given: `encoder_layers.2.*` chosen first becomes
    `encoder_layers.0.*`."""
    out = {}
    for name, value in weights.items():
        stack, _, rest = name.partition(".")
        chosen = {"encoder_layers": encoder, "decoder_layers": decoder}.get(stack)
        if not chosen:
            out[name] = value
            continue
        index, _, rest = rest.partition(".")
        for new, old in enumerate(chosen):
            if old == int(index):
                out[f"{stack}.{new}.{rest}"] = value
    return out


def _init_weights(cfg: Config, path: Path, model: Transformer, vocabs: tuple[Vocab, Vocab]) -> None:
    """`train.init_from` (resolved: `path`): the checkpoint's weights (its chosen
    layers), which need the run's tokenizers."""
    tc = cfg.train
    payload = load_checkpoint(path, mmap=True)
    theirs = entry_vocabs(payload["vocab"])
    if not (theirs[0].same(vocabs[0]) and theirs[1].same(vocabs[1])):
        raise TrainError(
            f"train.init_from: {path} has other tokenizers than the run's; set "
            f"tokenizer.from: {tc.init_from}, then run mtkit tokenizer and preprocess "
            f"again"
        )
    model.load_state_dict(
        chosen_layers(payload["model"], tc.init_encoder_layers, tc.init_decoder_layers)
    )
    chosen = [
        f"{'layer' if len(layers) == 1 else 'layers'} {', '.join(map(str, layers))} of the {side}"
        for side, layers in (
            ("encoder", tc.init_encoder_layers),
            ("decoder", tc.init_decoder_layers),
        )
        if layers
    ]
    log.info(
        "starting from the weights of %s (%s)%s",
        path,
        describe_weights(payload),
        f": its {' and '.join(chosen)}" if chosen else "",
    )


def freeze(model: Transformer, what: str) -> None:
    """`train.freeze`: no gradients for the embeddings (and so the tied output
    projection), the encoder, or both."""
    parts = {
        "embeddings": (model.src_embed, model.tgt_embed),
        "encoder": (model.encoder_layers, model.encoder_norm),
    }
    for name in () if what == "none" else what.split("+"):
        for module in parts[name]:
            module.requires_grad_(False)


def _resume(
    cfg: Config,
    found: tuple[Path, dict] | None,
    resume: bool,
    model: Transformer,
    optimizer,
    train_data: ShardDataset,
    vocabs: tuple[Vocab, Vocab],
    rank: int,
    world: int,
) -> Progress:
    """Load the newest intact checkpoint (`found`) into model and optimizer and return its
    progress; a fresh `Progress` when there is none (with --no-resume, old checkpoints
    move aside)."""
    tc, ckpt_dir = cfg.train, cfg.run_path / "checkpoints"
    if found is None:
        if not resume and rank == 0 and ckpt_dir.exists() and any(ckpt_dir.iterdir()):
            aside = ckpt_dir.with_name(f"checkpoints.{time.strftime('%Y%m%d-%H%M%S')}")
            ckpt_dir.rename(aside)
            log.warning("--no-resume: starting over; earlier checkpoints moved to %s", aside)
        if rank > 0:
            torch.manual_seed(tc.seed + 1000 * rank)
        return Progress()
    path, payload = found
    try:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["train"]["optimizer"])
        progress = Progress(**payload["train"]["progress"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{path}: cannot resume from it ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        ) from None
    others = payload["train"].get("rng_of_ranks", [])
    if rank == 0:
        _set_rng_state(payload["train"]["rng"])
    elif len(others) == world - 1:
        _set_rng_state(others[rank - 1])
    else:  # saved by a run of another world size, or by an mtkit that kept rank 0's only
        log.warning(
            "%s holds the RNG streams of %d rank(s), not %d: rank %d draws a fresh one",
            path,
            len(others) + 1,
            world,
            rank,
        )
        torch.manual_seed(tc.seed + 1000 * rank + progress.step)
    log.info(
        "resuming from %s at step %d (epoch %d, batch %d)",
        path,
        progress.step,
        progress.epoch,
        progress.batch,
    )
    return progress


def _same_start_on_every_rank(found: tuple[Path, dict] | None, run: Path) -> None:
    """Under DDP every rank resumes from the newest checkpoint in its own view of the run
    directory: refused on every rank, in one line, unless all found the same step (or
    none), as they do where the nodes share the run directory. A rank that started over
    beside one that resumed would take other batches and stop at another step."""
    step = None if found is None else found[1]["train"]["progress"]["step"]
    steps: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(steps, step)
    if len(set(steps)) > 1:
        seen = ", ".join(
            f"rank {r}: {'none' if s is None else f'step {s}'}" for r, s in enumerate(steps)
        )
        raise TrainError(
            f"the ranks found different checkpoints to resume from in {run} ({seen}); "
            f"every node must see the same run directory (shared storage)"
        )


def _check_same_model(cfg: Config, payload: dict, path: Path) -> None:
    """Refuse to resume with another model section; a field the checkpoint predates
    counts as its default (what that mtkit version trained)."""
    saved = {**dataclasses.asdict(ModelConfig()), **payload["config"]["model"]}
    now = config_to_dict(cfg)["model"]
    diff = [k for k in now if saved.get(k) != now[k]]
    if diff:
        k = diff[0]
        raise TrainError(
            f"{path} was trained with model.{k}={saved.get(k)!r}, the config "
            f"says {now[k]!r}; use another run_dir or --no-resume"
        )


def _check_same_data(
    payload: dict, path: Path, train_data: ShardDataset, vocabs: tuple[Vocab, Vocab]
) -> None:
    """Refuse to resume on shards or a tokenizer other than those the checkpoint saw."""
    saved = payload["train"].get("shards")  # absent in checkpoints of older mtkit versions
    vocab = payload["vocab"]
    if (saved is not None and saved != train_data.fingerprint) or (vocab["src"], vocab["tgt"]) != (
        vocabs[0].model_proto,
        vocabs[1].model_proto,
    ):
        raise TrainError(
            f"{path} was trained on other data or another tokenizer than "
            f"{train_data.folder} (preprocess or tokenizer ran again since); "
            f"start over with --no-resume, or use another run_dir"
        )


def _check_positions(cfg: Config, data: ShardDataset) -> None:
    """Every training pair, with its bos/eos, must fit the model's positions."""
    longest = int(max(data.src_lengths.max(initial=0), data.tgt_lengths.max(initial=0)))
    if longest + 1 > cfg.model.max_positions:
        raise TrainError(
            f"{data.folder} holds pairs of {longest} subwords, more than "
            f"model.max_positions={cfg.model.max_positions} allows (it must be at "
            f"least data.max_len + 2); rerun `mtkit preprocess` with a smaller "
            f"data.max_len or raise model.max_positions"
        )


def rng_state() -> dict:
    """The RNG streams training draws on (dropout); batching is seeded by (seed, epoch)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _batches_from(
    sampler: TokenBatchSampler, dataset: ShardDataset, progress: Progress, workers: int, pin: bool
) -> Iterator[tuple[int, int, Batch]]:
    """Endless (epoch, index in epoch, batch), starting at the saved position."""
    epoch, start = progress.epoch, progress.batch
    generator = torch.Generator()  # DataLoader seeds its workers from this, not the global RNG
    while True:
        sampler.set_epoch(epoch, start)
        loader = make_loader(dataset, sampler, workers, pin_memory=pin, generator=generator)
        with held_while_starting_workers():  # a signal to the group is the trainer's
            batches = iter(loader)  # starts the workers
        for k, batch in enumerate(batches, start=start):
            yield epoch, k, batch
        epoch, start = epoch + 1, 0

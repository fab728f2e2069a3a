"""The state of one training run (`TrainState`), and `setup`, which builds it: fresh, or
resumed from the newest intact checkpoint.

A resumed run must be the same run: the checkpoint's model config, shards and tokenizer
are the run's, or it is refused (`TrainError`: `mtkit.training.resume`), and it keeps the
choices measured at its first start (`mtkit.tuning.run.decided_once`: precision,
attention kernel, batch shapes, CUDA graphs). Fine-tuning's start is
`mtkit.training.finetune`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from mtkit.core.checkpoint import (
    SHORTLIST,
    CheckpointError,
    check_shortlist,
    find_resumable,
    load_tensors,
)
from mtkit.core.config import Config, save_config
from mtkit.core.device import join_ranks, resolve_device
from mtkit.core.errors import TrainError
from mtkit.core.languages import epoch_counts, output_vocabularies, tag_ids
from mtkit.core.signals import held_while_starting_workers
from mtkit.core.vocab import Vocab, load_vocabs
from mtkit.data.alignments import AlignedShards
from mtkit.data.batching import Batch, TokenBatchSampler, make_loader
from mtkit.data.shards import ShardDataset
from mtkit.model.transformer import Transformer, build_model, count_parameters, guided_attention
from mtkit.search.captured import CapturedDecoder
from mtkit.training.finetune import freeze, init_checkpoint, init_model_config, init_weights
from mtkit.training.graphs import CapturedUpdates, update_timer
from mtkit.training.metrics_log import MetricsLog
from mtkit.training.optim import adamw
from mtkit.training.resume import (
    Progress,
    check_complete,
    check_same_data,
    check_same_model,
    restore,
    same_start_on_every_rank,
)
from mtkit.tuning.capture import graph_choice
from mtkit.tuning.run import (
    RunChoices,
    batch_shapes,
    graphs_choice,
    graphs_possible,
    run_choices,
)

log = logging.getLogger("mtkit.training.loop")  # one stage: its lines read "mtkit.training.loop"


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
    device = resolve_device(tc.device)
    rank, world = join_ranks(device)
    distributed = world > 1
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    vocabs = load_vocabs(run, cfg.tokenizer.joint)
    shortlist = student_shortlist(cfg, vocabs)  # now, not at the first checkpoint
    train_data, valid_data = _open_data(cfg, vocabs)
    found = find_resumable(run / "checkpoints") if resume else None
    if distributed:
        same_start_on_every_rank(found, run)
    if found is not None:  # refused before anything is decided or logged
        check_complete(found[1], found[0])
        check_same_model(cfg, found[1], found[0])
        check_same_data(found[1], found[0], train_data, vocabs)
    choices = run_choices(cfg, device, found, train_data, distributed)

    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, len(vocabs[0]), len(vocabs[1])).to(device)
    if source is not None and found is None:
        init_weights(cfg, source, model, vocabs)
    freeze(model, tc.freeze)
    model.use_attention(choices.attention.value)
    if tc.guided_alignment:  # the head that learns the alignments (`batch_loss`)
        guided_attention(model).guided_head = 0
    optimizer = adamw(model, tc, device)
    graphs = graphs_choice(
        cfg,
        device,
        found,
        distributed,
        model,
        train_data,
        lambda batch: update_timer(
            model, lambda m: adamw(m, tc, device), batch, tc, device, choices.autocast_dtype
        ),
    )
    choices = replace(choices, graphs=graphs)
    metrics = _open_metrics(cfg, rank)
    progress = restore(cfg, found, resume, model, optimizer, train_data, vocabs, rank, world)
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

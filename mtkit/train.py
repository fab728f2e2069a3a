"""The training loop: AdamW, inverse-square-root warm-up, mixed precision, gradient
accumulation, validation with BLEU, checkpoints, exact resume, early stopping, DDP.

`train` reads as its loop: `setup` builds one `TrainState` (model, optimizer, progress,
batch stream); each turn `accumulate`s the `train.update_freq` micro-batches of one
update, `apply_update` takes the optimizer step, and `stop_reason`, a function of the
progress and the config alone, says when to stop. The loop's position (epoch, batch
within the epoch), the optimizer, every RNG and the step are in each checkpoint, so an
interrupted run that resumes gives the same weights as one that never stopped. Run under
`torchrun --nproc_per_node N` for DistributedDataParallel: every rank takes its own
share of each epoch's batches; only rank 0 validates, logs and saves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from mtkit.atomic import WriteError, remove_leftovers, write_failure
from mtkit.checkpoint import (
    CheckpointError,
    find_resumable,
    training_payload,
    write_training_checkpoint,
)
from mtkit.config import Config, TrainConfig, config_to_dict, save_config
from mtkit.data.batching import Batch, TokenBatchSampler, collate, make_loader, token_batches
from mtkit.data.shards import ShardDataset
from mtkit.device import (
    autocast,
    calibration_shape,
    cpu_description,
    resolve_device,
    resolve_precision,
)
from mtkit.errors import UserError
from mtkit.evaluate import score
from mtkit.loss import LossOutput, label_smoothed_nll
from mtkit.model import Transformer, build_model, count_parameters
from mtkit.progress import ProgressView
from mtkit.rundir import run_lock
from mtkit.search import greedy_search
from mtkit.vocab import Vocab, load_vocabs

log = logging.getLogger(__name__)

MAX_BAD_STEPS = 5  # consecutive non-finite updates before giving up


class TrainError(UserError, RuntimeError):
    """A training run that cannot start or go on (one line)."""



# --- schedule ----------------------------------------------------------------------------


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` at `warmup` steps, then peak * sqrt(warmup / step): the
    paper's schedule d^-0.5 * min(step^-0.5, step * warmup^-1.5) with its peak named."""
    step = max(step, 1)
    if warmup == 0:
        return peak
    return peak * min(step / warmup, math.sqrt(warmup / step))



# --- state ---------------------------------------------------------------------------


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


@dataclass(frozen=True)
class TrainResult:
    step: int
    epoch: int
    best_bleu: float | None  # None: the run has no validation data (data.valid)
    stopped_because: str
    run_dir: Path
    precision: str = "fp32"  # what training ran in: "fp32" or "bf16"

    def summary(self) -> str:
        """"stopped at step N (why); best valid BLEU B" or "...; no validation"."""
        scored = ("no validation (data.valid is not set)" if self.best_bleu is None
                  else f"best valid BLEU {self.best_bleu:.2f}")
        return f"stopped at step {self.step} ({self.stopped_because}); {scored}"

    @property
    def interrupted_by(self) -> str | None:
        """"SIGINT" or "SIGTERM" when a signal stopped training, else None."""
        prefix = "signal "
        return self.stopped_because[len(prefix):] if self.stopped_because.startswith(
            prefix) else None


def _rng_state() -> dict:
    """The RNG streams training draws on (dropout); batching is seeded by (seed, epoch)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class MetricsLog:
    """RUN/metrics.jsonl: one JSON object per event (rank 0 only). With `tensorboard`, the
    same training and validation figures also go to TensorBoard scalars in
    RUN/tensorboard/ (`train/loss`, `valid/bleu`, ...), at their step."""

    def __init__(self, path: Path | None, tensorboard: Path | None = None):
        self.path = path
        self.board = None
        if path is not None and tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TrainError("train.tensorboard needs TensorBoard: pip install "
                                 "'mtkit[tensorboard]'") from None
            self.board = SummaryWriter(str(tensorboard))

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        try:
            with open(self.path, "a", encoding="utf-8") as f:  # a log: appended in place
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise write_failure(e, self.path) or e from None
        if self.board is not None and event in ("train", "valid"):
            for key, value in fields.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    name = key.removeprefix("valid_") if event == "valid" else key
                    self.board.add_scalar(f"{event}/{name}", value, fields["step"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()


# --- validation ----------------------------------------------------------------------------


@torch.no_grad()
def validate(model: Transformer, data: ShardDataset, tgt_vocab: Vocab, cfg: Config,
             device: torch.device, autocast_dtype: torch.dtype | None) -> dict[str, float]:
    """Valid loss and perplexity (teacher forcing) and the BLEU of greedy decoding."""
    was_training = model.training
    model.eval()
    batches = token_batches(data.src_lengths, data.tgt_lengths, cfg.decode.batch_tokens,
                            seed=0, epoch=0, shuffle=False)
    limit = model.cfg.max_positions - 1  # valid pairs are not length-filtered: cut them
    loss_sum = nll_sum = 0.0
    tokens = 0
    hyps: dict[int, str] = {}
    for idx in batches:
        batch = collate([(x[:limit], y[:limit]) for x, y in (data[i] for i in idx)]).to(device)
        with autocast(device, autocast_dtype):
            out = batch_loss(model, batch, cfg.train.label_smoothing)
            ids = greedy_search(model, batch.src, cfg.decode.max_len_a, cfg.decode.max_len_b)
        loss_sum += out.loss.item()
        nll_sum += out.nll.item()
        tokens += out.tokens
        for i, out_ids in zip(idx.tolist(), ids, strict=True):
            hyps[i] = tgt_vocab.decode(out_ids)
    refs = data.texts("tgt") or [tgt_vocab.decode(data[i][1].tolist()) for i in range(len(data))]
    bleu = score([hyps[i] for i in range(len(data))], refs, ["bleu"])[0].score
    model.train(was_training)
    return {"valid_loss": loss_sum / tokens, "valid_nll": nll_sum / tokens,
            "valid_ppl": math.exp(min(nll_sum / tokens, 50.0)), "valid_bleu": bleu}



def _batches_from(sampler: TokenBatchSampler, dataset: ShardDataset, progress: Progress,
                  workers: int, pin: bool) -> Iterator[tuple[int, int, Batch]]:
    """Endless (epoch, index in epoch, batch), starting at the saved position."""
    epoch, start = progress.epoch, progress.batch
    generator = torch.Generator()  # DataLoader seeds its workers from this, not the global RNG
    while True:
        sampler.set_epoch(epoch, start)
        loader = make_loader(dataset, sampler, workers, pin_memory=pin, generator=generator)
        for k, batch in enumerate(loader, start=start):
            yield epoch, k, batch
        epoch, start = epoch + 1, 0


class _StopSignal:
    """Turns SIGINT/SIGTERM into a flag, so the loop saves a checkpoint and stops."""

    def __init__(self):
        self.received: str | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        log.warning("%s received: saving a checkpoint and stopping (again to abort)",
                    self.received)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def _check_same_model(cfg: Config, payload: dict, path: Path) -> None:
    saved = payload["config"]["model"]
    now = config_to_dict(cfg)["model"]
    diff = [k for k in now if saved.get(k) != now[k]]
    if diff:
        k = diff[0]
        raise TrainError(f"{path} was trained with model.{k}={saved.get(k)!r}, the config "
                         f"says {now[k]!r}; use another run_dir or --no-resume")


def _check_same_data(payload: dict, path: Path, train_data: ShardDataset,
                     vocabs: tuple[Vocab, Vocab]) -> None:
    """Refuse to resume on shards or a tokenizer other than those the checkpoint saw."""
    saved = payload["train"].get("shards")  # absent in checkpoints of older mtkit versions
    vocab = payload["vocab"]
    if (saved is not None and saved != train_data.fingerprint) or (
            vocab["src"], vocab["tgt"]) != (vocabs[0].model_proto, vocabs[1].model_proto):
        raise TrainError(f"{path} was trained on other data or another tokenizer than "
                         f"{train_data.folder} (preprocess or tokenizer ran again since); "
                         f"start over with --no-resume, or use another run_dir")


def _check_positions(cfg: Config, data: ShardDataset) -> None:
    """Every training pair, with its bos/eos, must fit the model's positions."""
    longest = int(max(data.src_lengths.max(initial=0), data.tgt_lengths.max(initial=0)))
    if longest + 1 > cfg.model.max_positions:
        raise TrainError(f"{data.folder} holds pairs of {longest} subwords, more than "
                         f"model.max_positions={cfg.model.max_positions} allows (it must be at "
                         f"least data.max_len + 2); rerun `mtkit preprocess` with a smaller "
                         f"data.max_len or raise model.max_positions")


# --- the training state ---------------------------------------------------------------


@dataclass
class TrainState:
    """Everything one training run works on, built once by `setup`."""

    cfg: Config
    model: Transformer
    wrapped: nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    progress: Progress
    batches: Iterator[tuple[int, int, Batch]]  # endless (epoch, index in epoch, batch)
    batches_per_epoch: int  # this rank's; the same every epoch (see TokenBatchSampler)
    vocabs: tuple[Vocab, Vocab]
    train_data: ShardDataset
    valid_data: ShardDataset | None
    device: torch.device
    autocast_dtype: torch.dtype | None
    precision: dict  # {"precision", "asked", "cpu", "calibration"?}: decided at the first start
    metrics: MetricsLog
    rank: int
    world: int
    clock_start: float  # perf_counter() at which `progress.elapsed` would have been 0
    saved_step: int  # the step of the newest checkpoint

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(cfg: Config, resume: bool) -> TrainState:
    """Check the run's data, build the model and optimizer, resume from the newest intact
    checkpoint when asked, and open the batch stream at the saved position."""
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
    train_data = ShardDataset(run / "data" / "train")
    valid_data = ShardDataset(run / "data" / "valid") if (run / "data" / "valid").exists() \
        else None
    for data in (train_data, valid_data):
        if data is not None:
            data.check_tokenizer(*vocabs)
            data.verify()
    _check_positions(cfg, train_data)
    found = find_resumable(run / "checkpoints") if resume else None
    if found is not None:  # refused before anything is decided or logged
        _check_same_model(cfg, found[1], found[0])
        _check_same_data(found[1], found[0], train_data, vocabs)
    autocast_dtype, precision = run_precision(cfg, device, found, distributed)

    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, len(vocabs[0]), len(vocabs[1])).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=inverse_sqrt_lr(1, tc.lr, tc.warmup_steps), betas=(0.9, 0.98),
        eps=1e-9, weight_decay=tc.weight_decay, fused=device.type == "cuda")
    metrics = MetricsLog(run / "metrics.jsonl" if rank == 0 else None,
                         run / "tensorboard" if tc.tensorboard else None)
    progress = _resume(cfg, found, resume, model, optimizer, train_data, vocabs, rank)
    if rank == 0:
        save_config(cfg, run / "config.yaml")
        log.info("model: %s parameters; device %s, %s; %d rank(s)", f"{count_parameters(model):,}",
                 device, "bf16 autocast" if autocast_dtype else "fp32", world)
        metrics.write("start", step=progress.step, parameters=count_parameters(model),
                      device=str(device), world_size=world, resumed=found is not None,
                      **precision)
    wrapped: nn.Module = model
    if distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    wrapped.train()
    sampler = TokenBatchSampler(train_data.src_lengths, train_data.tgt_lengths, tc.max_tokens,
                                seed=tc.seed, rank=rank, world_size=world)
    batches = _batches_from(sampler, train_data, progress, cfg.data.loader_workers,
                            pin=device.type == "cuda")
    sampler.set_epoch(progress.epoch)  # (the stream starts it at the saved batch)
    return TrainState(cfg, model, wrapped, optimizer, progress, batches, len(sampler),
                      vocabs, train_data, valid_data,
                      device, autocast_dtype, precision, metrics, rank, world,
                      clock_start=time.perf_counter() - progress.elapsed,
                      saved_step=progress.step)


def run_precision(cfg: Config, device: torch.device,
                  found: tuple[Path, dict] | None, distributed: bool = False
                  ) -> tuple[torch.dtype | None, dict]:
    """The precision a run trains in, decided once, at its first start, and kept in every
    checkpoint: a resumed run reuses it and never measures again (a second measurement on
    a busy machine could switch precision mid-run). A resume whose `train.precision` names
    the other precision is refused. Returns the autocast dtype (None for fp32) and the
    record stored with the run: {"precision", "asked", "cpu" (the machine of the first
    start), "calibration" (when measured)}."""
    asked = cfg.train.precision
    stored = found[1]["train"].get("precision") if found is not None else None
    if stored is not None:
        name = stored["precision"]
        if asked not in ("auto", name):
            raise TrainError(f"{found[0]} was trained in {name}, the config says "
                             f"train.precision={asked}; resume with train.precision={name} "
                             f"(or auto), or start over with --no-resume")
        measured = stored.get("calibration")
        log.info("precision %s, as decided at this run's first start (%s); not measured "
                 "again", name, f"fp32 {measured['fp32_ms']} ms, bf16 {measured['bf16_ms']} "
                 f"ms" if measured else f"train.precision={stored['asked']}")
        return (torch.bfloat16 if name == "bf16" else None), dict(stored)
    if found is not None:
        log.warning("%s does not say which precision it was trained in (an older mtkit); "
                    "deciding it now", found[0])
    tc = cfg.train
    dtype, calibration = resolve_precision(
        asked, device, calibration_shape(tc.max_tokens, cfg.model.d_model, cfg.model.ffn_dim))
    if distributed and device.type == "cpu":  # every rank takes rank 0's measurement
        flag = torch.tensor([float(dtype is not None)])
        dist.broadcast(flag, 0)
        dtype = torch.bfloat16 if flag.item() else None
    record = {"precision": "bf16" if dtype is not None else "fp32", "asked": asked,
              "cpu": cpu_description() if device.type == "cpu" else str(device)}
    if calibration is not None:
        record["calibration"] = calibration.as_dict()
    return dtype, record


def _resume(cfg: Config, found: tuple[Path, dict] | None, resume: bool, model: Transformer,
            optimizer, train_data: ShardDataset, vocabs: tuple[Vocab, Vocab],
            rank: int) -> Progress:
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
        raise CheckpointError(f"{path}: cannot resume from it ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:100]})") from None
    if rank == 0:
        _set_rng_state(payload["train"]["rng"])
    else:  # other ranks' RNG streams are not saved; derive fresh ones
        torch.manual_seed(tc.seed + 1000 * rank + progress.step)
    log.info("resuming from %s at step %d (epoch %d, batch %d)", path, progress.step,
             progress.epoch, progress.batch)
    return progress


# --- one update ----------------------------------------------------------------------


@dataclass
class Update:
    """The micro-batches of one optimizer update: summed loss, nll and target tokens."""

    loss: float = 0.0
    nll: float = 0.0
    tokens: int = 0
    skipped: bool = False  # a CUDA out-of-memory batch: its gradients were dropped


def batches_left(progress: Progress, tc: TrainConfig, per_epoch: int) -> int | None:
    """Batches this rank may still take before `max_epochs` (None: no epoch limit)."""
    if not tc.max_epochs:
        return None
    return tc.max_epochs * per_epoch - ((progress.epoch - 1) * per_epoch + progress.batch)


def accumulate(state: TrainState) -> Update:
    """Forward and backward `update_freq` micro-batches, summing gradients in .grad. The
    last update before `max_epochs` may take fewer: the epoch's last batches still count."""
    tc, p = state.cfg.train, state.progress
    left = batches_left(p, tc, state.batches_per_epoch)
    micro_batches = tc.update_freq if left is None else min(tc.update_freq, left)
    update = Update()
    for micro in range(micro_batches):
        epoch, k, batch = next(state.batches)
        if epoch != p.epoch:
            state.metrics.write("epoch", epoch=p.epoch, step=p.step)
            p.epoch = epoch
        p.batch = k + 1
        batch = batch.to(state.device, non_blocking=True)
        sync = not state.distributed or micro == micro_batches - 1  # DDP: all-reduce once
        try:
            with nullcontext() if sync else state.wrapped.no_sync():
                out = _forward_backward(state.wrapped, batch, tc.label_smoothing, state.device,
                                        state.autocast_dtype)
        except RuntimeError as e:
            if not _is_oom(e) or state.distributed:
                raise
            state.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            log.warning("out of memory on a batch of %s; skipped", tuple(batch.src.shape))
            state.metrics.write("oom_skip", step=p.step, shape=list(batch.src.shape))
            return Update(skipped=True)
        update.loss += out.loss.item()
        update.nll += out.nll.item()
        update.tokens += out.tokens
    return update


def apply_update(state: TrainState, update: Update) -> tuple[float, float] | None:
    """Per-token gradients, clipping, the learning rate of the next step, AdamW. Returns
    (lr, gradient norm), or None when the gradients were not finite (update skipped)."""
    tc, p = state.cfg.train, state.progress
    grad_norm = _per_token_gradients(state.model, update.tokens, tc.clip_norm, state.device,
                                     state.distributed)
    if not torch.isfinite(grad_norm):
        state.optimizer.zero_grad(set_to_none=True)
        log.warning("non-finite loss or gradient at step %d; update skipped", p.step + 1)
        state.metrics.write("nonfinite_skip", step=p.step + 1, loss=update.loss)
        return None
    lr = inverse_sqrt_lr(p.step + 1, tc.lr, tc.warmup_steps)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    p.step += 1
    p.elapsed = time.perf_counter() - state.clock_start
    return lr, float(grad_norm)


def stop_reason(progress: Progress, tc: TrainConfig, per_epoch: int,
                signal_name: str | None) -> str:
    """Why training stops now, or "" to go on."""
    if progress.early_stopped:
        return "patience"
    if signal_name:
        return f"signal {signal_name}"
    if tc.max_steps and progress.step >= tc.max_steps:
        return "max_steps"
    if tc.max_time and progress.elapsed >= tc.max_time:
        return "max_time"
    if batches_left(progress, tc, per_epoch) == 0:
        return "max_epochs"
    return ""


# --- validation, checkpoints, progress -----------------------------------------------------


def save(state: TrainState, is_best: bool) -> None:
    """Rank 0 writes step_<N>.pt (and last.pt, best.pt)."""
    if not state.main:
        return
    p = state.progress
    payload = training_payload(
        config_to_dict(state.cfg), (state.vocabs[0].model_proto, state.vocabs[1].model_proto),
        state.model.state_dict(), state.optimizer.state_dict(), _rng_state(),
        dataclasses.asdict(p), state.train_data.fingerprint, state.precision)
    path = write_training_checkpoint(payload, state.cfg.run_path / "checkpoints", p.step,
                                     is_best, state.cfg.train.keep_last)
    state.metrics.write("checkpoint", step=p.step, path=str(path), best=is_best)
    state.saved_step = p.step


def validate_and_save(state: TrainState) -> None:
    """Rank 0 validates, keeps the best BLEU and saves; every rank learns whether
    patience ran out (`progress.early_stopped`)."""
    p, tc = state.progress, state.cfg.train
    stop = torch.zeros(1)
    if state.main and state.valid_data is None:  # nothing to validate on: just save
        save(state, is_best=False)
    elif state.main:
        scores = validate(state.model, state.valid_data, state.vocabs[1], state.cfg,
                          state.device, state.autocast_dtype)
        bleu = scores["valid_bleu"]
        is_best = bleu > p.best_bleu
        if is_best:
            p.best_bleu, p.bad_validations = bleu, 0
        else:
            p.bad_validations += 1
        state.metrics.write("valid", step=p.step, epoch=p.epoch,
                            **{k: round(v, 4) for k, v in scores.items()},
                            best_bleu=round(p.best_bleu, 4))
        log.info("valid | step %d | loss %.3f | ppl %.2f | bleu %.2f (best %.2f)", p.step,
                 scores["valid_loss"], scores["valid_ppl"], bleu, p.best_bleu)
        p.early_stopped = 0 < tc.patience <= p.bad_validations
        save(state, is_best)
        stop[0] = float(p.early_stopped)
    if state.distributed:
        dist.broadcast(stop, 0)
    p.early_stopped = bool(stop.item())


@dataclass
class Window:
    """Training figures since the last progress record."""

    tokens: int = 0
    loss: float = 0.0
    nll: float = 0.0
    start: float = field(default_factory=time.perf_counter)

    def add(self, update: Update) -> None:
        self.tokens += update.tokens
        self.loss += update.loss
        self.nll += update.nll

    def report(self, state: TrainState, view: ProgressView, lr: float, grad_norm: float
               ) -> None:
        """Rank 0 writes a `train` record and shows it; the window starts over."""
        if state.main:
            p, now = state.progress, time.perf_counter()
            record = {"step": p.step, "epoch": p.epoch, "loss": self.loss / max(self.tokens, 1),
                      "ppl": math.exp(min(self.nll / max(self.tokens, 1), 50.0)), "lr": lr,
                      "grad_norm": grad_norm,
                      "tokens_per_s": self.tokens * state.world / max(now - self.start, 1e-9)}
            state.metrics.write("train", **{k: round(v, 6) if isinstance(v, float) else v
                                            for k, v in record.items()})
            view.update(p, record)
        self.tokens, self.loss, self.nll, self.start = 0, 0.0, 0.0, time.perf_counter()


# --- the loop ----------------------------------------------------------------------------


def train(cfg: Config, resume: bool = True) -> TrainResult:
    """Train on RUN/data with the config; returns how far it got and why it stopped.

    Rank 0 holds the run directory's lock for the whole run. A failed write (disk full)
    stops training with one line; the checkpoints written before it stay intact."""
    main = int(os.environ.get("RANK", 0)) == 0
    with run_lock(cfg.run_path, "train") if main else nullcontext():
        if main:
            remove_leftovers(cfg.run_path / "checkpoints", ("*",))
            remove_leftovers(cfg.run_path, ("config.yaml",))
        try:
            return _train(cfg, resume)
        except WriteError as e:
            raise TrainError(f"{e}; earlier checkpoints are intact") from None


def _train(cfg: Config, resume: bool) -> TrainResult:
    # Ctrl-C is a flag from the start: one that comes during set-up stops before step 1.
    with _StopSignal() as signals:
        state = setup(cfg, resume)
        view = ProgressView(cfg.train, state.progress, enabled=state.main)
        try:
            return _loop(state, view, signals)
        finally:
            view.close()
            state.metrics.close()


def _loop(state: TrainState, view: ProgressView, signals: _StopSignal) -> TrainResult:
    """Updates until `stop_reason` says why not; then the last checkpoint or validation."""
    cfg = state.cfg
    tc, p = cfg.train, state.progress
    first_step, bad_updates, window = p.step, 0, Window()
    while not (reason := stop_reason(p, tc, state.batches_per_epoch, signals.received)):
        update = accumulate(state)
        if update.skipped:
            continue
        stepped = apply_update(state, update)
        if stepped is None:
            bad_updates += 1
            if bad_updates >= MAX_BAD_STEPS:
                raise TrainError(f"{bad_updates} updates in a row had a non-finite loss "
                                 f"or gradient (step {p.step + 1}); lower train.lr or "
                                 f"check the data")
            continue
        bad_updates = 0
        window.add(update)
        view.update(p)
        if p.step % tc.log_every == 0:
            window.report(state, view, *stepped)
        if p.step % tc.valid_every == 0:
            validate_and_save(state)
        elif tc.save_every and p.step % tc.save_every == 0:
            save(state, is_best=False)
    if reason.startswith("signal") and p.step != state.saved_step:
        save(state, is_best=False)
    elif reason in ("max_steps", "max_epochs", "max_time") and p.step > first_step \
            and p.step % tc.valid_every != 0:
        validate_and_save(state)
    validated = state.valid_data is not None
    state.metrics.write("end", step=p.step, reason=reason,
                        best_bleu=round(p.best_bleu, 4) if validated else None)
    result = TrainResult(p.step, p.epoch, p.best_bleu if validated else None, reason,
                         cfg.run_path, state.precision["precision"])
    if state.main:
        log.info("%s", result.summary())
    if state.distributed:
        dist.barrier()
    return result


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
    """The loss of one batch, summed over its tokens, as training computes it: the loss
    makes the output projection a chunk at a time (`mtkit.loss`), so the logits of the
    whole batch never exist at once."""
    return label_smoothed_nll(model(batch.src, batch.tgt_in, project=False), batch.tgt_out,
                              label_smoothing)


def _forward_backward(model: nn.Module, batch: Batch, label_smoothing: float,
                      device: torch.device, autocast_dtype: torch.dtype | None):
    """Loss of one batch (summed over its tokens) and its gradients, added to .grad."""
    with autocast(device, autocast_dtype):
        out = batch_loss(model, batch, label_smoothing)
    out.loss.backward()
    return out


def _per_token_gradients(model: nn.Module, tokens: int, clip_norm: float,
                         device: torch.device, distributed: bool) -> torch.Tensor:
    """Turn the summed gradients of one update into per-token means, clip them, and
    return their norm before clipping (non-finite when the loss was).

    Each rank's gradients hold sums over its own tokens, averaged over ranks by DDP, so
    they are divided by the mean token count per rank."""
    count = torch.tensor([float(tokens)], device=device)
    if distributed:
        dist.all_reduce(count)
        count /= dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(count.clamp(min=1.0))
    return nn.utils.clip_grad_norm_(model.parameters(),
                                    clip_norm if clip_norm > 0 else float("inf"))

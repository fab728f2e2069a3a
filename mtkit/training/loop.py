"""The training loop: gradient accumulation, mixed precision, validation with BLEU,
checkpoints, exact resume, early stopping, DDP.

`train` reads as its loop: `setup` (`mtkit.training.state`) builds one `TrainState` (model,
optimizer, progress, batch stream), fresh or resumed; each turn `accumulate`s the
`train.update_freq` micro-batches of one update, `apply_update` takes the optimizer step
(AdamW and its schedule: `mtkit.training.optim`), and `stop_reason`, a function of the progress
and the config alone, says when to stop. The loop's position (epoch, batch within the
epoch), the optimizer, every RNG and the step are in each checkpoint, so an interrupted
run that resumes gives the same weights as one that never stopped. Events go to
RUN/metrics.jsonl (`mtkit.training.metrics_log`), progress to stderr
(`mtkit.core.progress`). Run under `torchrun --nproc_per_node N` for
DistributedDataParallel: every rank takes its own
share of each epoch's batches; only rank 0 validates, logs and saves.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from mtkit.core.atomic import WriteError, remove_leftovers
from mtkit.core.checkpoint import (
    SHORTLIST,
    load_tensors,
    training_payload,
    write_training_checkpoint,
)
from mtkit.core.config import Config, TrainConfig, config_to_dict
from mtkit.core.device import autocast
from mtkit.core.languages import tag_end, tag_ids, without_tag
from mtkit.core.progress import ProgressView
from mtkit.core.rundir import run_lock
from mtkit.core.scoring import score
from mtkit.core.signals import StopFlag
from mtkit.core.vocab import Vocab, vocab_entry
from mtkit.data.batching import Batch, collate, token_batches
from mtkit.data.shards import ShardDataset
from mtkit.model.loss import LossOutput, output_and_loss
from mtkit.model.transformer import Transformer
from mtkit.search.beam import greedy_search
from mtkit.training.optim import learning_rate, per_token_gradients, set_lr
from mtkit.training.state import Progress, TrainError, TrainState, rng_state, setup

log = logging.getLogger(__name__)

MAX_BAD_STEPS = 5  # consecutive non-finite updates before giving up


@dataclass(frozen=True)
class TrainResult:
    step: int
    epoch: int
    best_bleu: float | None  # None: the run has no validation data (data.valid)
    stopped_because: str
    run_dir: Path
    precision: str = "fp32"  # what training ran in: "fp32" or "bf16"

    def summary(self) -> str:
        """ "stopped at step N (why); best valid BLEU B", or "...; no validation" (no
        data.valid), or "...; not validated yet" (stopped before the first validation,
        where `Progress.best_bleu` still holds its -1 start)."""
        if self.best_bleu is None:
            scored = "no validation (data.valid is not set)"
        elif self.best_bleu < 0:
            scored = "not validated yet"
        else:
            scored = f"best valid BLEU {self.best_bleu:.2f}"
        return f"stopped at step {self.step} ({self.stopped_because}); {scored}"

    @property
    def interrupted_by(self) -> str | None:
        """ "SIGINT" or "SIGTERM" when a signal stopped training, else None."""
        prefix = "signal "
        return (
            self.stopped_because[len(prefix) :] if self.stopped_because.startswith(prefix) else None
        )


# --- the loop -------------------------------------------------------------------------


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
    with StopFlag() as signals:
        state = setup(cfg, resume)
        view = ProgressView(cfg.train, state.progress, enabled=state.main)
        try:
            return _loop(state, view, signals)
        finally:
            view.close()
            state.metrics.close()


def _loop(state: TrainState, view: ProgressView, signals: StopFlag) -> TrainResult:
    """Updates until `stop_reason` says why not; then the last checkpoint or validation."""
    cfg = state.cfg
    tc, p = cfg.train, state.progress
    first_step, bad_updates, window = p.step, 0, Window()
    while not (reason := stop_reason(p, tc, state.sampler.epoch_size, signals.received)):
        update = accumulate(state)
        if update.skipped_oom:
            continue
        stepped = apply_update(state, update)
        if stepped is None:
            bad_updates += 1
            if bad_updates >= MAX_BAD_STEPS:
                raise TrainError(
                    f"{bad_updates} updates in a row had a non-finite loss "
                    f"or gradient (step {p.step + 1}); lower train.lr or "
                    f"check the data"
                )
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
    elif (
        reason in ("max_steps", "max_epochs", "max_time")
        and p.step > first_step
        and p.step % tc.valid_every != 0
    ):
        validate_and_save(state)
    validated = state.valid_data is not None
    state.metrics.write(
        "end", step=p.step, reason=reason, best_bleu=round(p.best_bleu, 4) if validated else None
    )
    result = TrainResult(
        p.step,
        p.epoch,
        p.best_bleu if validated else None,
        reason,
        cfg.run_path,
        state.choices.precision.value,
    )
    if state.main:
        log.info("%s", result.summary())
    if state.distributed:
        dist.barrier()
    return result


# --- one update -----------------------------------------------------------------------


@dataclass
class Update:
    """The micro-batches of one optimizer update: summed loss, nll and target tokens."""

    loss: float = 0.0
    nll: float = 0.0
    tokens: int = 0
    skipped_oom: bool = False  # a CUDA out-of-memory batch: its gradients were dropped


def accumulate(state: TrainState) -> Update:
    """Forward and backward `update_freq` micro-batches, summing gradients in .grad. The
    last update before `max_epochs` may take fewer: the epoch's last batches still count."""
    tc, p = state.cfg.train, state.progress
    left = batches_left(p, tc, state.sampler.epoch_size)
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
                out = _forward_backward(
                    state.wrapped, batch, tc.label_smoothing, state.device, state.autocast_dtype
                )
        except RuntimeError as e:
            if not _is_oom(e) or state.distributed:
                raise
            state.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            log.warning("out of memory on a batch of %s; skipped", tuple(batch.src.shape))
            state.metrics.write("oom_skip", step=p.step, shape=list(batch.src.shape))
            return Update(skipped_oom=True)
        update.loss += out.loss.item()
        update.nll += out.nll.item()
        update.tokens += out.tokens
    return update


def apply_update(state: TrainState, update: Update) -> tuple[float, float] | None:
    """Per-token gradients, clipping, the learning rate of the next step, AdamW. Returns
    (lr, gradient norm), or None when the gradients were not finite (update skipped)."""
    tc, p = state.cfg.train, state.progress
    grad_norm = per_token_gradients(
        state.model, update.tokens, tc.clip_norm, state.device, state.distributed
    )
    if not torch.isfinite(grad_norm):
        state.optimizer.zero_grad(set_to_none=True)
        log.warning("non-finite loss or gradient at step %d; update skipped", p.step + 1)
        state.metrics.write("nonfinite_skip", step=p.step + 1, loss=update.loss)
        return None
    lr = learning_rate(p.step + 1, p.elapsed, tc)  # elapsed: up to the last update
    set_lr(state.optimizer, lr)
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    p.step += 1
    p.elapsed = time.perf_counter() - state.clock_start
    return lr, float(grad_norm)


def batch_loss(model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
    """The loss of one batch, summed over its tokens, as training computes it: the model's
    training forward gives the decoder's output, and `output_and_loss` makes the output
    layer's logits a chunk at a time with the loss, so the logits of the whole batch never
    exist at once."""
    return output_and_loss(model(batch.src, batch.tgt_in), batch.tgt_out, label_smoothing)


def _forward_backward(
    model: nn.Module,
    batch: Batch,
    label_smoothing: float,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
):
    """Loss of one batch (summed over its tokens) and its gradients, added to .grad."""
    with autocast(device, autocast_dtype):
        out = batch_loss(model, batch, label_smoothing)
    out.loss.backward()
    return out


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e)


def batches_left(
    progress: Progress, tc: TrainConfig, per_epoch: int | Callable[[int], int]
) -> int | None:
    """Batches this rank may still take before `max_epochs` (None: no epoch limit).
    `per_epoch`: this rank's batches in every epoch, or in epoch e (`epoch_size(e)`:
    under temperature sampling each epoch has its own)."""
    if not tc.max_epochs:
        return None
    size = per_epoch if callable(per_epoch) else (lambda epoch: per_epoch)
    if progress.epoch > tc.max_epochs:
        return 0
    return (
        size(progress.epoch)
        - progress.batch
        + sum(size(e) for e in range(progress.epoch + 1, tc.max_epochs + 1))
    )


def stop_reason(
    progress: Progress,
    tc: TrainConfig,
    per_epoch: int | Callable[[int], int],
    signal_name: str | None,
) -> str:
    """Why training stops now, or "" to go on."""
    if progress.early_stopped:
        return "patience"
    if signal_name:
        return f"signal {signal_name}"
    if tc.max_steps and progress.step >= tc.max_steps:
        return "max_steps"
    if tc.max_time and progress.elapsed >= tc.max_time:
        return "max_time"
    left = batches_left(progress, tc, per_epoch)
    if left is not None and left <= 0:
        return "max_epochs"
    return ""


# --- validation and checkpoints -------------------------------------------------------


def validate_and_save(state: TrainState) -> None:
    """Rank 0 validates, keeps the best BLEU and saves; every rank learns whether
    patience ran out (`progress.early_stopped`)."""
    p, tc = state.progress, state.cfg.train
    stop = torch.zeros(1)
    if state.main and state.valid_data is None:  # nothing to validate on: just save
        save(state, is_best=False)
    elif state.main:
        scores = validate(
            state.model,
            state.valid_data,
            state.vocabs[1],
            state.cfg,
            state.device,
            state.autocast_dtype,
        )
        bleu = scores["valid_bleu"]
        is_best = bleu > p.best_bleu
        if is_best:
            p.best_bleu, p.bad_validations = bleu, 0
        else:
            p.bad_validations += 1
        state.metrics.write(
            "valid", step=p.step, epoch=p.epoch, **_rounded(scores), best_bleu=round(p.best_bleu, 4)
        )
        each = "".join(
            f" | {d} {s['valid_bleu']:.2f}" for d, s in scores.get("by_direction", {}).items()
        )
        log.info(
            "valid | step %d | loss %.3f | ppl %.2f | bleu %.2f%s (best %.2f)",
            p.step,
            scores["valid_loss"],
            scores["valid_ppl"],
            bleu,
            " (mean of the directions)" + each if each else "",
            p.best_bleu,
        )
        p.early_stopped = 0 < tc.patience <= p.bad_validations
        save(state, is_best)
        stop[0] = float(p.early_stopped)
    if state.distributed:
        dist.broadcast(stop, 0)
    p.early_stopped = bool(stop.item())


def _rounded(scores: dict) -> dict:
    """Scores for metrics.jsonl, to 4 decimals (nested: a direction's)."""
    return {k: _rounded(v) if isinstance(v, dict) else round(v, 4) for k, v in scores.items()}


@torch.no_grad()
def validate(
    model: Transformer,
    data: ShardDataset,
    tgt_vocab: Vocab,
    cfg: Config,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> dict:
    """Valid loss and perplexity (teacher forcing) and the BLEU of greedy decoding. With
    several directions (a multilingual run) each is scored on its own (`by_direction`)
    and valid_bleu is their mean, which `best.pt` follows."""
    was_training = model.training
    model.eval()
    refs = data.texts("tgt") or [tgt_vocab.decode(data[i][1].tolist()) for i in range(len(data))]
    tags = tag_ids(tgt_vocab, cfg.data) if cfg.model.lang_tag == "target" else frozenset()
    if tags:  # each target starts with its tag: forced when decoding, not scored
        refs = [without_tag(r) for r in refs]
    scored = {
        d: _validate_pairs(model, data, ix, refs, tgt_vocab, cfg, device, autocast_dtype, tags)
        for d, ix in data.directions().items()
    }
    model.train(was_training)
    nll = sum(s.nll for s in scored.values()) / sum(s.tokens for s in scored.values())
    out = {
        "valid_loss": sum(s.loss for s in scored.values()) / sum(s.tokens for s in scored.values()),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 50.0)),
        "valid_bleu": sum(s.bleu for s in scored.values()) / len(scored),
    }
    if len(scored) > 1:
        out["by_direction"] = {
            d: {
                "valid_loss": s.loss / s.tokens,
                "valid_ppl": math.exp(min(s.nll / s.tokens, 50.0)),
                "valid_bleu": s.bleu,
            }
            for d, s in scored.items()
        }
    return out


class _Scored(NamedTuple):
    loss: float  # summed over the target tokens
    nll: float
    tokens: int
    bleu: float


def _validate_pairs(
    model: Transformer,
    data: ShardDataset,
    pairs: np.ndarray,
    refs: list[str],
    tgt_vocab: Vocab,
    cfg: Config,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    tags: frozenset[int],
) -> _Scored:
    """Loss sums and greedy BLEU over some of the valid pairs (one direction's). With
    target-side `tags` each output is forced to start with its target's tag, cut off
    before scoring."""
    batches = token_batches(
        data.src_lengths[pairs],
        data.tgt_lengths[pairs],
        cfg.decode.batch_tokens,
        seed=0,
        epoch=0,
        shuffle=False,
    )
    limit = model.cfg.max_positions - 1  # valid pairs are not length-filtered: cut them
    loss_sum = nll_sum = 0.0
    tokens = 0
    hyps: dict[int, str] = {}
    for idx in (pairs[b] for b in batches):
        xy = [(x[:limit], y[:limit]) for x, y in (data[i] for i in idx)]
        batch = collate(xy).to(device)
        forced = [y[: tag_end(y, tags)].tolist() for _, y in xy] if tags else None
        with autocast(device, autocast_dtype):
            out = batch_loss(model, batch, cfg.train.label_smoothing)
            ids = greedy_search(
                model, batch.src, cfg.decode.max_len_a, cfg.decode.max_len_b, prefixes=forced
            )
        loss_sum += out.loss.item()
        nll_sum += out.nll.item()
        tokens += out.tokens
        for i, out_ids in zip(idx.tolist(), ids, strict=True):
            hyps[i] = tgt_vocab.decode(out_ids[tag_end(out_ids, tags) :])
    order = pairs.tolist()
    bleu = score([hyps[i] for i in order], [refs[i] for i in order], ["bleu"])[0].score
    return _Scored(loss_sum, nll_sum, tokens, bleu)


def save(state: TrainState, is_best: bool) -> None:
    """Rank 0 writes step_<N>.pt (and last.pt, best.pt)."""
    if not state.main:
        return
    p = state.progress
    payload = training_payload(
        config_to_dict(state.cfg),
        vocab_entry(*state.vocabs),
        state.model.state_dict(),
        state.optimizer.state_dict(),
        rng_state(),
        dataclasses.asdict(p),
        state.train_data.fingerprint,
        state.choices.as_record(),
        _shortlist(state.cfg),
    )
    path = write_training_checkpoint(
        payload, state.cfg.run_path / "checkpoints", p.step, is_best, state.cfg.train.keep_last
    )
    state.metrics.write("checkpoint", step=p.step, path=str(path), best=is_best)
    state.saved_step = p.step


def _shortlist(cfg: Config) -> dict | None:
    """A distilled student's lexical shortlist (`mtkit distill` wrote it), kept in its
    checkpoints, or None."""
    path = cfg.run_path / SHORTLIST
    return load_tensors(path) if cfg.distill.teacher and path.exists() else None


# --- progress records -----------------------------------------------------------


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

    def report(self, state: TrainState, view: ProgressView, lr: float, grad_norm: float) -> None:
        """Rank 0 writes a `train` record and shows it; the window starts over."""
        if state.main:
            p, now = state.progress, time.perf_counter()
            record = {
                "step": p.step,
                "epoch": p.epoch,
                "loss": self.loss / max(self.tokens, 1),
                "ppl": math.exp(min(self.nll / max(self.tokens, 1), 50.0)),
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens_per_s": self.tokens * state.world / max(now - self.start, 1e-9),
            }
            state.metrics.write(
                "train",
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()},
            )
            view.update(p, record)
        self.tokens, self.loss, self.nll, self.start = 0, 0.0, 0.0, time.perf_counter()

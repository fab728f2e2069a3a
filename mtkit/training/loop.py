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
import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from mtkit.core.atomic import WriteError, remove_leftovers
from mtkit.core.checkpoint import training_payload, write_training_checkpoint
from mtkit.core.config import Config, TrainConfig, config_to_dict
from mtkit.core.device import autocast
from mtkit.core.errors import TrainError, first_line
from mtkit.core.languages import tag_end, tag_ids, without_tag
from mtkit.core.progress import ProgressView
from mtkit.core.rundir import run_lock
from mtkit.core.scoring import score
from mtkit.core.search_options import SearchOptions
from mtkit.core.signals import StopFlag
from mtkit.core.vocab import Vocab, vocab_entry
from mtkit.data.batching import Batch, collate, token_batches
from mtkit.data.shards import ShardDataset
from mtkit.model.loss import LossOutput, output_and_loss
from mtkit.model.transformer import Transformer, guided_attention
from mtkit.search.beam import greedy_search
from mtkit.search.captured import CapturedDecoder
from mtkit.training.optim import learning_rate, per_token_gradients, set_lr
from mtkit.training.resume import Progress, rng_state
from mtkit.training.state import TrainState, setup

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
    ours = not dist.is_initialized()  # setup starts the process group under torchrun
    with run_lock(cfg.run_path, "train") if main else nullcontext():
        if main:
            remove_leftovers(cfg.run_path / "checkpoints", ("*",))
            remove_leftovers(cfg.run_path, ("config.yaml",))
        try:
            result = _train(cfg, resume)
            if ours and dist.is_initialized():  # (its teardown at exit can hang)
                dist.destroy_process_group()
            return result
        except WriteError as e:
            raise TrainError(f"{e}; earlier checkpoints are intact") from None
        except RuntimeError as e:
            if not (dist.is_initialized() and _lost_a_rank(e)):
                raise
            raise TrainError(
                f"rank {dist.get_rank()} lost contact with another rank ({_connection_reason(e)}); "
                f"the checkpoints written are intact: start every node again to resume"
            ) from None


def _lost_a_rank(e: RuntimeError) -> bool:
    """Whether a collective failed because another rank (or its node) went away: NCCL
    and the store raise `DistError`s, Gloo a RuntimeError that names it."""
    return isinstance(e, dist.DistError) or "gloo" in str(e).lower()


def _connection_reason(e: BaseException) -> str:
    """ "Connection reset by peer" from "[.../pair.cc:537] Read error [...]: Connection
    reset by peer. This is typically ...": the reason, without the source position."""
    line = re.sub(r"^\[[^\]]*\]\s*", "", first_line(e, limit=10**6))
    return line.split(". ")[0][:160]


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
    """Updates until `stop_reason` says why not; then the last checkpoint or validation.

    Nothing in an update waits for the device: the losses, the gradient norm and whether
    the gradients were finite stay there (`Window`), and the host reads them every
    `log_every` steps (and at the end), one read for them all."""
    cfg = state.cfg
    tc, p = cfg.train, state.progress
    first_step, window, signal = p.step, Window(), SignalAcrossRanks(state, signals)
    while not (reason := stop_reason(p, tc, state.sampler.epoch_size, signal.received())):
        batches = next_batches(state)
        captured = _captured(state, batches)
        if captured is not None:
            update, stepped = captured
        else:
            update = accumulate(state, batches)
            if update.skipped_oom:
                continue
            stepped = apply_update(state, update)
        window.add(update, stepped)
        signal.post()
        view.update(p)
        if p.step % tc.log_every == 0:
            window.report(state, view)
        if p.step % tc.valid_every == 0:
            validate_and_save(state)
        elif tc.save_every and p.step % tc.save_every == 0:
            save(state, is_best=False)
    window.settle(state)
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


class SignalAcrossRanks:
    """Whether training was signalled to stop, agreed by every rank under DDP: a signal
    may reach one rank only (one node's process group) or the ranks at different moments,
    and a rank that stopped alone would leave the others waiting in a collective. After
    each update every rank posts what it received (an all-reduce it does not wait for),
    and before the next one all read the sum: all stop after the same update, one after
    the first rank saw the signal at most. The flag is a CPU tensor, in a Gloo group of
    its own under NCCL, so that reading it never waits for the GPU. In one process it
    is `StopFlag.received`."""

    CODES = {None: 0, "SIGINT": 1, "SIGTERM": 2}

    def __init__(self, state: TrainState, signals: StopFlag):
        self.signals, self.distributed = signals, state.distributed
        self.posted: tuple[torch.Tensor, object] | None = None
        self.group = None  # the default group where it is Gloo's (CPUs)
        if self.distributed and dist.get_backend() != "gloo":
            self.group = dist.new_group(backend="gloo")  # every rank makes it, in step

    def post(self) -> None:
        if self.distributed:
            flag = torch.tensor([self.CODES[self.signals.received]], dtype=torch.int32)
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            self.posted = flag, work

    def received(self) -> str | None:
        if not self.distributed:
            return self.signals.received
        if self.posted is None:
            return None
        flag, work = self.posted
        work.wait()
        names = {code: name for name, code in self.CODES.items()}
        return names[int(flag.item())]


# --- one update -----------------------------------------------------------------------


@dataclass
class Update:
    """The micro-batches of one optimizer update: summed loss and nll (scalars on the
    device, not read here) and target tokens."""

    loss: torch.Tensor | float = 0.0
    nll: torch.Tensor | float = 0.0
    tokens: int = 0
    skipped_oom: bool = False  # a CUDA out-of-memory batch: its gradients were dropped
    captured: bool = False  # replayed by its shape's CUDA graph (`mtkit.training.graphs`)


def next_batches(state: TrainState) -> list[Batch]:
    """The `update_freq` micro-batches of the next update, on the host; the progress
    moves past them. The last update before `max_epochs` may take fewer: the epoch's
    last batches still count."""
    tc, p = state.cfg.train, state.progress
    left = batches_left(p, tc, state.sampler.epoch_size)
    micro_batches = tc.update_freq if left is None else min(tc.update_freq, left)
    batches = []
    for _ in range(micro_batches):
        epoch, k, batch = next(state.batches)
        if epoch != p.epoch:
            state.metrics.write("epoch", epoch=p.epoch, step=p.step)
            p.epoch = epoch
        p.batch = k + 1
        batches.append(batch)
    return batches


def accumulate(state: TrainState, batches: list[Batch]) -> Update:
    """Forward and backward the micro-batches of one update, summing gradients in .grad."""
    tc, p = state.cfg.train, state.progress
    update = Update()
    for micro, batch in enumerate(batches):
        batch = batch.to(state.device, non_blocking=True)
        sync = not state.distributed or micro == len(batches) - 1  # DDP: all-reduce once
        try:
            with nullcontext() if sync else state.wrapped.no_sync():
                out = _forward_backward(
                    state.wrapped,
                    batch,
                    tc.label_smoothing,
                    state.device,
                    state.autocast_dtype,
                    tc.guided_alignment,
                )
        except RuntimeError as e:
            if not _is_oom(e) or state.distributed:
                raise
            state.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            log.warning("out of memory on a batch of %s; skipped", tuple(batch.src.shape))
            state.metrics.write("oom_skip", step=p.step, shape=list(batch.src.shape))
            return Update(skipped_oom=True)
        update.loss = update.loss + out.loss.detach()
        update.nll = update.nll + out.nll.detach()
        update.tokens += out.tokens
    return update


def _captured(state: TrainState, batches: list[Batch]) -> tuple[Update, Stepped] | None:
    """The update of one batch by its shape's CUDA graph (`state.captured`), or None
    where updates run eagerly (no graphs, several micro-batches, a shape left eager)."""
    if state.captured is None or len(batches) != 1:
        return None
    p, tc = state.progress, state.cfg.train
    lr = learning_rate(p.step + 1, p.elapsed, tc)
    done = state.captured.run(batches[0], lr)
    if done is None:
        return None
    figures, tokens = done
    update = Update(figures.loss, figures.nll, tokens, captured=True)
    return update, _stepped(state, lr, figures.grad_norm, figures.nonfinite)


class Stepped(NamedTuple):
    """What one update did, on the device: the gradient norm before clipping, and whether
    the gradients were not finite (then the update changed nothing); and its rate."""

    step: int  # the update's number, from 1
    lr: float
    grad_norm: torch.Tensor  # () float
    nonfinite: torch.Tensor  # () bool


def apply_update(state: TrainState, update: Update) -> Stepped:
    """Per-token gradients, clipping, the learning rate of this step, AdamW; the step
    counts either way. Where the gradients are not finite the update is skipped, decided
    on the device: the fused AdamW takes the flag (`found_inf`, as under a gradient
    scaler) and leaves the weights, its moments and its step count as they were. An
    unfused AdamW (a torch without a fused kernel for the device) has no such flag:
    there the host reads it."""
    tc, p = state.cfg.train, state.progress
    grad_norm = per_token_gradients(
        state.model, update.tokens, tc.clip_norm, state.device, state.distributed
    )
    nonfinite = ~torch.isfinite(grad_norm)
    lr = learning_rate(p.step + 1, p.elapsed, tc)  # elapsed: up to the last update
    set_lr(state.optimizer, lr)
    if state.optimizer.defaults.get("fused"):
        state.optimizer.found_inf = nonfinite.float()
        state.optimizer.step()
    elif not nonfinite:
        state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    return _stepped(state, lr, grad_norm.detach(), nonfinite)


def _stepped(
    state: TrainState, lr: float, grad_norm: torch.Tensor, nonfinite: torch.Tensor
) -> Stepped:
    """The progress after an update, eager or captured."""
    p = state.progress
    p.step += 1
    p.elapsed = time.perf_counter() - state.clock_start
    return Stepped(p.step, lr, grad_norm, nonfinite)


def batch_loss(
    model: nn.Module, batch: Batch, label_smoothing: float, guided: float = 0.0
) -> LossOutput:
    """The loss of one batch, summed over its tokens, as training computes it: the model's
    training forward gives the decoder's output, and `output_and_loss` makes the output
    layer's logits a chunk at a time with the loss, so the logits of the whole batch never
    exist at once. With guided alignment (`guided`, the batch's `align`), the loss also
    holds `guided` x the cross-entropy of the guided head's attention against the
    alignment (summed over the aligned target positions)."""
    out = output_and_loss(model(batch.src, batch.tgt_in), batch.tgt_out, label_smoothing)
    if not guided or batch.align is None:
        return out
    weights = guided_attention(getattr(model, "module", model)).guided  # (B, T, S)
    alignment = -(batch.align * torch.log(weights.clamp_min(1e-9))).sum()
    return replace(out, loss=out.loss + guided * alignment)


def _forward_backward(
    model: nn.Module,
    batch: Batch,
    label_smoothing: float,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    guided: float = 0.0,
):
    """Loss of one batch (summed over its tokens) and its gradients, added to .grad."""
    with autocast(device, autocast_dtype):
        out = batch_loss(model, batch, label_smoothing, guided)
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
    """Rank 0 validates and keeps the best BLEU; every rank saves (`save`) and learns
    whether patience ran out (`progress.early_stopped`)."""
    p, tc = state.progress, state.cfg.train
    stop, is_best = torch.zeros(1), False
    if state.main and state.valid_data is not None:
        scores = validate(
            state.model,
            state.valid_data,
            state.vocabs[1],
            state.cfg,
            state.device,
            state.autocast_dtype,
            state.decoder,
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
        stop[0] = float(p.early_stopped)
    save(state, is_best)
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
    decoder: CapturedDecoder | None = None,
) -> dict:
    """Valid loss and perplexity (teacher forcing) and the BLEU of greedy decoding. With
    several directions (a multilingual run) each is scored on its own (`by_direction`)
    and valid_bleu is their mean, which `best.pt` follows. `decoder`: the model's steps
    as graphs, decoding in fixed shapes (decode.cuda_graphs), else the model's own."""
    was_training = model.training
    model.eval()
    refs = data.texts("tgt") or [tgt_vocab.decode(data[i][1].tolist()) for i in range(len(data))]
    tags = tag_ids(tgt_vocab, cfg.data) if cfg.model.lang_tag == "target" else frozenset()
    if tags:  # each target starts with its tag: forced when decoding, not scored
        refs = [without_tag(r) for r in refs]
    scored = {
        d: _validate_pairs(
            model, data, ix, refs, tgt_vocab, cfg, device, autocast_dtype, tags, decoder
        )
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
    decoder: CapturedDecoder | None = None,
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
                decoder or model,
                batch.src,
                SearchOptions(max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b),
                prefixes=forced,
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
    """Rank 0 writes step_<N>.pt (and last.pt, best.pt). Every rank calls it: under DDP
    rank 0 gathers the RNG streams of all ranks first, so that each resumes its own."""
    rngs = [rng_state()]
    if state.distributed:
        gathered = [None] * state.world if state.main else None
        dist.gather_object(rngs[0], gathered, dst=0)
        rngs = gathered or []
    if not state.main:
        return
    p = state.progress
    payload = training_payload(
        config_to_dict(state.cfg),
        vocab_entry(*state.vocabs),
        state.model.state_dict(),
        state.optimizer.state_dict(),
        rngs[0],
        dataclasses.asdict(p),
        state.train_data.fingerprint,
        state.choices.as_record(),
        state.shortlist,
        rng_of_ranks=rngs[1:],
    )
    path = write_training_checkpoint(
        payload, state.cfg.run_path / "checkpoints", p.step, is_best, state.cfg.train.keep_last
    )
    state.metrics.write("checkpoint", step=p.step, path=str(path), best=is_best)
    state.saved_step = p.step


# --- progress records -----------------------------------------------------------


@dataclass
class Window:
    """Training figures since the last progress record, summed on the device: the host
    reads them in one go (`settle`) when a record is written, so that no update waits
    for the device. Updates whose gradients were not finite count in `skipped`, not in
    the loss; `in_a_row` counts such updates up to the last one, across windows."""

    tokens: int = 0  # every update's, for tokens/s
    updates: int = 0
    captured: int = 0  # updates replayed by a CUDA graph
    scored: torch.Tensor | int = 0  # the tokens of the updates that were applied
    loss: torch.Tensor | float = 0.0
    nll: torch.Tensor | float = 0.0
    skipped: torch.Tensor | int = 0
    in_a_row: torch.Tensor | int = 0
    last: Stepped | None = None
    first_step: int = 0  # the window's first update (from 1); 0: none yet
    start: float = field(default_factory=time.perf_counter)

    def add(self, update: Update, stepped: Stepped) -> None:
        bad = stepped.nonfinite
        self.tokens += update.tokens
        self.updates += 1
        self.captured += update.captured
        self.scored = self.scored + (~bad) * update.tokens
        self.loss = self.loss + torch.where(bad, 0.0, update.loss)
        self.nll = self.nll + torch.where(bad, 0.0, update.nll)
        self.skipped = self.skipped + bad
        self.in_a_row = (self.in_a_row + 1) * bad
        self.last = stepped
        self.first_step = self.first_step or stepped.step

    def settle(self, state: TrainState) -> dict | None:
        """Read the window's figures from the device (one wait), record and warn about
        skipped updates, and stop the run after `MAX_BAD_STEPS` in a row; None when the
        window has no update. Every rank reads (each decides to stop, the same way)."""
        if self.last is None:
            return None
        sums = (self.scored, self.loss, self.nll, self.skipped, self.in_a_row, self.last.grad_norm)
        scored, loss, nll, skipped, in_a_row, grad_norm = torch.stack(
            [torch.as_tensor(x, dtype=torch.float64, device=state.device) for x in sums]
        ).tolist()
        p = state.progress
        if skipped:
            if state.main:
                log.warning(
                    "%d of the updates %d-%d had a non-finite loss or gradient; skipped",
                    skipped,
                    self.first_step,
                    p.step,
                )
            state.metrics.write("nonfinite_skip", step=p.step, updates=int(skipped))
        if in_a_row >= MAX_BAD_STEPS:
            raise TrainError(
                f"{int(in_a_row)} updates in a row had a non-finite loss or gradient "
                f"(up to step {p.step}); lower train.lr or check the data"
            )
        return {"scored": scored, "loss": loss, "nll": nll, "grad_norm": grad_norm}

    def report(self, state: TrainState, view: ProgressView) -> None:
        """Rank 0 writes a `train` record and shows it; the window starts over, but for
        `in_a_row`."""
        figures = self.settle(state)
        if state.main and figures is not None:
            p, now = state.progress, time.perf_counter()
            scored = max(figures["scored"], 1)
            record = {
                "step": p.step,
                "epoch": p.epoch,
                "loss": figures["loss"] / scored,
                "ppl": math.exp(min(figures["nll"] / scored, 50.0)),
                "lr": self.last.lr,
                "grad_norm": figures["grad_norm"],
                "tokens_per_s": self.tokens * state.world / max(now - self.start, 1e-9),
            }
            if state.captured is not None:  # which update ran: graphs, or some eager
                record["captured_updates"] = f"{self.captured}/{self.updates}"
            state.metrics.write(
                "train",
                **{k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()},
            )
            view.update(p, record)
        self.__init__(in_a_row=self.in_a_row)

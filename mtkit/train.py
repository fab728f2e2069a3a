"""The training loop: AdamW, inverse-square-root warm-up, mixed precision, gradient
accumulation, validation with BLEU, checkpoints, exact resume, early stopping, DDP.

One optimizer step consumes `train.update_freq` batches. The loop's position (epoch,
batch within the epoch), the optimizer, every RNG and the step are in each checkpoint,
so an interrupted run that resumes gives the same weights as one that never stopped.
Run under `torchrun --nproc_per_node N` for DistributedDataParallel: every rank takes
its own share of each epoch's batches; only rank 0 validates, logs and saves.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
import torch.distributed as dist
from torch import nn

from mtkit.atomic import WriteError, remove_leftovers, write_failure
from mtkit.checkpoint import CheckpointError, find_resumable, write_training_checkpoint
from mtkit.config import Config, TrainConfig, config_to_dict, save_config
from mtkit.data.batching import Batch, TokenBatchSampler, collate, make_loader, token_batches
from mtkit.data.shards import ShardDataset
from mtkit.loss import label_smoothed_nll
from mtkit.model import Transformer, build_model, count_parameters
from mtkit.rundir import run_lock
from mtkit.search import greedy_search
from mtkit.tokenizer import Vocab, load_vocabs

log = logging.getLogger(__name__)

MAX_BAD_STEPS = 5  # consecutive non-finite updates before giving up


class TrainError(RuntimeError):
    """A training run that cannot start or go on (one line)."""


# --- devices and precision -------------------------------------------------------------


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """`auto` -> CUDA when present, else CPU. Asking for CUDA without one is an error
    whose message names `option`, the way the user asked (`--device` or `train.device`)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            sep = " " if option.startswith("--") else "="
            raise TrainError(f"{option}{sep}cuda, but no CUDA device is available "
                             f"(use {option}{sep}auto or cpu)")
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def cpu_has_bf16_matrix_units() -> bool:
    """AMX tiles. AVX512-BF16 alone does not count: on such a CPU (these development
    machines) a bf16 matrix product measured 0.64x the speed of fp32, not faster."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp32":
        return None
    if device.type == "cuda" or cpu_has_bf16_matrix_units():
        return torch.bfloat16
    return None


def tune_cpu_runtime() -> None:
    """Two process-wide settings that make CPU training markedly faster.

    Flush denormal floats to zero: the exponentials of the loss's backward pass slowed
    10x on denormal inputs. And make glibc keep large freed blocks instead of returning
    them to the OS: by default every allocation over 32 MB (logits, their gradient) gets
    fresh pages from the kernel, and the page faults cost more than the arithmetic on
    them (1.3x faster training of the Multi30k model on 2 cores). The allocator setting
    is skipped where the C library is not glibc."""
    torch.set_flush_denormal(True)
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, 1 << 31)
    except (OSError, AttributeError) as e:
        log.debug("mallopt unavailable (%s); using the allocator's defaults", e)


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
    best_bleu: float
    stopped_because: str
    run_dir: Path
    model: Transformer  # the weights after the last step (not the best checkpoint)

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
    """RUN/metrics.jsonl: one JSON object per event (rank 0 only)."""

    def __init__(self, path: Path | None):
        self.path = path

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        try:
            with open(self.path, "a", encoding="utf-8") as f:  # a log: appended in place
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise write_failure(e, self.path) or e from None


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
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            out = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out,
                                     cfg.train.label_smoothing)
            ids = greedy_search(model, batch.src, cfg.decode.max_len_a, cfg.decode.max_len_b)
        loss_sum += out.loss.item()
        nll_sum += out.nll.item()
        tokens += out.tokens
        for i, out_ids in zip(idx.tolist(), ids, strict=True):
            hyps[i] = tgt_vocab.decode(out_ids)
    refs = data.texts("tgt") or [tgt_vocab.decode(data[i][1].tolist()) for i in range(len(data))]
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in range(len(data))], [refs]).score
    model.train(was_training)
    return {"valid_loss": loss_sum / tokens, "valid_nll": nll_sum / tokens,
            "valid_ppl": math.exp(min(nll_sum / tokens, 50.0)), "valid_bleu": bleu}


# --- the loop ----------------------------------------------------------------------------


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


def _checkpoint_payload(cfg: Config, model: Transformer, optimizer, progress: Progress,
                        vocabs: tuple[Vocab, Vocab], shards: str) -> dict:
    return {
        "config": config_to_dict(cfg),
        "vocab": {"src": vocabs[0].model_proto, "tgt": vocabs[1].model_proto},
        "model": model.state_dict(),
        "train": {"optimizer": optimizer.state_dict(), "rng": _rng_state(),
                  "progress": dataclasses.asdict(progress), "shards": shards},
    }


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
    tc = cfg.train
    run = cfg.run_path
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    device = resolve_device(tc.device)
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    main = rank == 0
    autocast_dtype = resolve_precision(tc.precision, device)
    if device.type == "cpu":
        tune_cpu_runtime()
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
    ckpt_dir = run / "checkpoints"

    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, len(vocabs[0]), len(vocabs[1])).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=inverse_sqrt_lr(1, tc.lr, tc.warmup_steps), betas=(0.9, 0.98),
        eps=1e-9, weight_decay=tc.weight_decay, fused=device.type == "cuda")
    progress = Progress()

    found = find_resumable(ckpt_dir) if resume else None
    if found is not None:
        path, payload = found
        _check_same_model(cfg, payload, path)
        _check_same_data(payload, path, train_data, vocabs)
        try:
            model.load_state_dict(payload["model"])
            optimizer.load_state_dict(payload["train"]["optimizer"])
            progress = Progress(**payload["train"]["progress"])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}: cannot resume from it ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:100]})") from None
        if main:
            _set_rng_state(payload["train"]["rng"])
        else:  # other ranks' RNG streams are not saved; derive fresh ones
            torch.manual_seed(tc.seed + 1000 * rank + progress.step)
        log.info("resuming from %s at step %d (epoch %d, batch %d)", path, progress.step,
                 progress.epoch, progress.batch)
    elif not resume and main and ckpt_dir.exists() and any(ckpt_dir.iterdir()):
        aside = ckpt_dir.with_name(f"checkpoints.{time.strftime('%Y%m%d-%H%M%S')}")
        ckpt_dir.rename(aside)
        log.warning("--no-resume: starting over; earlier checkpoints moved to %s", aside)
    elif distributed:
        torch.manual_seed(tc.seed + 1000 * rank)

    metrics = MetricsLog(run / "metrics.jsonl" if main else None)
    if main:
        save_config(cfg, run / "config.yaml")
        log.info("model: %s parameters; device %s, %s; %d rank(s)", f"{count_parameters(model):,}",
                 device, "bf16 autocast" if autocast_dtype else "fp32", world)
        metrics.write("start", step=progress.step, parameters=count_parameters(model),
                      device=str(device), precision="bf16" if autocast_dtype else "fp32",
                      world_size=world)

    wrapped: nn.Module = model
    if distributed:
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    sampler = TokenBatchSampler(train_data.src_lengths, train_data.tgt_lengths, tc.max_tokens,
                                seed=tc.seed, rank=rank, world_size=world)
    batches = _batches_from(sampler, train_data, progress, cfg.data.loader_workers,
                            pin=device.type == "cuda")

    def save(is_best: bool) -> None:
        if main:
            payload = _checkpoint_payload(cfg, model, optimizer, progress, vocabs,
                                          train_data.fingerprint)
            path = write_training_checkpoint(payload, ckpt_dir, progress.step, is_best,
                                             tc.keep_last)
            metrics.write("checkpoint", step=progress.step, path=str(path), best=is_best)

    def run_validation() -> bool:
        """Validate on rank 0, save; returns True when patience is used up."""
        stop = torch.zeros(1)
        if main:
            scores = (validate(model, valid_data, vocabs[1], cfg, device, autocast_dtype)
                      if valid_data is not None else {})
            bleu = scores.get("valid_bleu", -1.0)
            is_best = bleu > progress.best_bleu
            if is_best:
                progress.best_bleu, progress.bad_validations = bleu, 0
            else:
                progress.bad_validations += 1
            metrics.write("valid", step=progress.step, epoch=progress.epoch,
                          **{k: round(v, 4) for k, v in scores.items()},
                          best_bleu=round(progress.best_bleu, 4))
            if scores:
                log.info("valid | step %d | loss %.3f | ppl %.2f | bleu %.2f (best %.2f)",
                         progress.step, scores["valid_loss"], scores["valid_ppl"], bleu,
                         progress.best_bleu)
            progress.early_stopped = 0 < tc.patience <= progress.bad_validations
            save(is_best)
            stop[0] = float(progress.early_stopped)
        if distributed:
            dist.broadcast(stop, 0)
        return bool(stop.item())

    wrapped.train()
    bad_steps = 0
    window_tokens, window_start, window_loss, window_nll = 0, time.perf_counter(), 0.0, 0.0
    session_start = time.perf_counter() - progress.elapsed
    stopped_because = ""
    first_step = progress.step
    if progress.early_stopped:
        stopped_because = "patience"
    with _StopSignal() as stop_signal:
        while not stopped_because:
            if tc.max_steps and progress.step >= tc.max_steps:
                stopped_because = "max_steps"
                break
            if tc.max_time and progress.elapsed >= tc.max_time:
                stopped_because = "max_time"
                break
            # One update: accumulate `update_freq` batches.
            loss_sum, nll_sum, tokens, skipped = 0.0, 0.0, 0, False
            for micro in range(tc.update_freq):
                epoch, k, batch = next(batches)
                if epoch != progress.epoch:
                    if tc.max_epochs and progress.epoch >= tc.max_epochs:
                        stopped_because = "max_epochs"
                        break
                    metrics.write("epoch", epoch=progress.epoch, step=progress.step)
                    progress.epoch = epoch
                progress.batch = k + 1
                batch = batch.to(device, non_blocking=True)
                last_micro = micro == tc.update_freq - 1
                try:
                    with wrapped.no_sync() if distributed and not last_micro else nullcontext():
                        out = _forward_backward(wrapped, batch, tc.label_smoothing, device,
                                                autocast_dtype)
                except RuntimeError as e:
                    if not _is_oom(e) or distributed:
                        raise
                    optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    log.warning("out of memory on a batch of %s; skipped", tuple(batch.src.shape))
                    metrics.write("oom_skip", step=progress.step, shape=list(batch.src.shape))
                    skipped = True
                    break
                loss_sum += out.loss.item()
                nll_sum += out.nll.item()
                tokens += out.tokens
            if stopped_because:
                break
            if skipped:
                continue
            grad_norm = _per_token_gradients(model, tokens, tc.clip_norm, device, distributed)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                bad_steps += 1
                log.warning("non-finite loss or gradient at step %d; update skipped",
                            progress.step + 1)
                metrics.write("nonfinite_skip", step=progress.step + 1, loss=loss_sum)
                if bad_steps >= MAX_BAD_STEPS:
                    raise TrainError(f"{bad_steps} updates in a row had a non-finite loss or "
                                     f"gradient (step {progress.step + 1}); lower train.lr "
                                     f"or check the data")
                continue
            bad_steps = 0
            lr = inverse_sqrt_lr(progress.step + 1, tc.lr, tc.warmup_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.step += 1
            progress.elapsed = time.perf_counter() - session_start
            window_tokens += tokens
            window_loss += loss_sum
            window_nll += nll_sum

            if main and progress.step % tc.log_every == 0:
                now = time.perf_counter()
                rate = window_tokens * world / max(now - window_start, 1e-9)
                record = {"step": progress.step, "epoch": progress.epoch,
                          "loss": window_loss / max(window_tokens, 1),
                          "ppl": math.exp(min(window_nll / max(window_tokens, 1), 50.0)),
                          "lr": lr, "grad_norm": float(grad_norm), "tokens_per_s": rate}
                metrics.write("train", **{k: round(v, 6) if isinstance(v, float) else v
                                          for k, v in record.items()})
                _progress_line(progress, record, tc)
                window_tokens, window_start, window_loss, window_nll = 0, now, 0.0, 0.0

            if progress.step % tc.valid_every == 0:
                if run_validation():
                    stopped_because = "patience"
            elif tc.save_every and progress.step % tc.save_every == 0:
                save(is_best=False)
            if stop_signal.received and not stopped_because:
                stopped_because = f"signal {stop_signal.received}"
                save(is_best=False)

        if progress.step > first_step and progress.step % tc.valid_every != 0 and (
                stopped_because in ("max_steps", "max_epochs", "max_time")):
            run_validation()
    if main:
        metrics.write("end", step=progress.step, reason=stopped_because,
                      best_bleu=round(progress.best_bleu, 4))
        log.info("stopped at step %d (%s); best valid BLEU %.2f", progress.step,
                 stopped_because, progress.best_bleu)
    if distributed:
        dist.barrier()
    return TrainResult(progress.step, progress.epoch, progress.best_bleu, stopped_because, run,
                       model)


def _forward_backward(model: nn.Module, batch: Batch, label_smoothing: float,
                      device: torch.device, autocast_dtype: torch.dtype | None):
    """Loss of one batch (summed over its tokens) and its gradients, added to .grad."""
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                        enabled=autocast_dtype is not None):
        out = label_smoothed_nll(model(batch.src, batch.tgt_in), batch.tgt_out,
                                 label_smoothing)
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


def _progress_line(progress: Progress, record: dict, tc: TrainConfig) -> None:
    """Progress on stderr: step, loss, lr, tokens/s and, with a step limit, the ETA."""
    if not log.isEnabledFor(logging.INFO):  # mtkit --quiet
        return
    eta = ""
    if tc.max_steps:
        per_step = progress.elapsed / max(progress.step, 1)
        eta = f" | ETA {_clock((tc.max_steps - progress.step) * per_step)}"
    elif tc.max_time:
        eta = f" | ETA {_clock(tc.max_time - progress.elapsed)}"
    total = f"/{tc.max_steps}" if tc.max_steps else ""
    line = (f"train | step {progress.step}{total} | epoch {progress.epoch} | loss "
            f"{record['loss']:.3f} | lr {record['lr']:.2e} | "
            f"{record['tokens_per_s']:,.0f} tok/s{eta}")
    print(line, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


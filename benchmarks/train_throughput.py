"""Training throughput: target tokens/s, peak memory and model FLOP utilisation.

    python benchmarks/train_throughput.py --config configs/multi30k.yaml [--compare hf]
        [--precision auto|fp32|bf16] [--steps 12] [--synthetic 32 32] [--device auto]
        [--set train.max_tokens=4096] [--batch-shapes auto|exact|classes] [--rounds 3]

Runs full training steps (forward, label-smoothed loss, backward, clipping, AdamW) on
the same batches: real ones from RUN/data/train (run `mtkit preprocess` first) or, with
`--synthetic S T`, random batches of source length S and target length T sized to
train.max_tokens. Steps before the window warm up and are not timed. Prints one JSON
line. With `--compare hf` it also builds a Hugging Face `transformers` MarianMTModel
of the same dimensions (random init, nothing downloaded; `pip install mtkit[bench]`),
runs the same batches through it in the same process (in fp32, its default, and at
mtkit's precision), each with both of its attention implementations, `eager` and
`sdpa` (eager measured faster on CPUs), and compares mtkit with the faster one.
Achieved model FLOP/s are set beside a large matrix product timed in the same run at
the same precision. With `--rounds N` the sides take turns N times (mtkit, then each
Hugging Face setting, round after round) and every figure is a median, so that a slow
spell of a shared machine falls on both sides. mtkit's batches are token-bucketed or in
few shapes, as `train.batch_shapes` decides (measured under auto, as `mtkit train`
does); where they are in few shapes, Hugging Face runs on both kinds and its faster
counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from mtkit.core.config import ModelConfig, load_config
from mtkit.core.device import cpu_description, resolve_device, tune_cpu_runtime
from mtkit.core.vocab import PAD, Vocab
from mtkit.data.batching import (
    Batch,
    BatchShapes,
    collate,
    shaped_batches,
    shaped_collate,
    token_batches,
)
from mtkit.data.shards import ShardDataset
from mtkit.model.transformer import build_model
from mtkit.training.loop import batch_loss
from mtkit.tuning.attention import AttentionShape, choose_attention
from mtkit.tuning.precision import calibration_shape, resolve_precision
from mtkit.tuning.shapes import choose_batch_shapes

# Run in the child: at exit, write its own VmHWM (the peak RSS of its memory map, which
# exec resets) to the file named by $MTKIT_PEAK_FILE. (ru_maxrss from wait4 would not do:
# Linux carries the parent's peak over fork and exec into the child's figure.)
_PEAK_PROBE = """
import atexit, os, re, runpy, sys
def _write():
    status = open("/proc/self/status").read()
    open(os.environ["MTKIT_PEAK_FILE"], "w").write(re.search(r"VmHWM:\\s+(\\d+)", status)[1])
atexit.register(_write)
sys.argv = ["mtkit"] + sys.argv[1:]
runpy.run_module("mtkit", run_name="__main__")
"""


def process_peak_rss_mb(args: list[str]) -> float:
    """Peak RSS in MB of one `mtkit ARGS` process (stdout discarded)."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".peak") as f:
        subprocess.run(
            [sys.executable, "-c", _PEAK_PROBE, *args],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "MTKIT_PEAK_FILE": f.name},
        )
        return int(open(f.name).read()) / 1024


class PeakMemory:
    """Peak memory during a block: CUDA allocator peak, or sampled process RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        else:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()


def model_flops(cfg: ModelConfig, vocab: int, batch: Batch) -> float:
    """Matrix-product FLOPs of one training step (forward x 3) on the padded batch."""
    b, s = batch.src.shape
    t = batch.tgt_in.size(1)
    d, f = cfg.d_model, cfg.ffn_dim
    enc = cfg.encoder_layers * (b * s * (2 * 4 * d * d + 2 * 2 * d * f) + 2 * 2 * b * s * s * d)
    dec = cfg.decoder_layers * (
        b * t * (2 * 4 * d * d + 2 * 2 * d * d + 2 * 2 * d * f)  # self-attn, cross q/o, FFN
        + b * s * 2 * 2 * d * d  # cross-attention keys and values
        + 2 * 2 * b * t * t * d
        + 2 * 2 * b * t * s * d
    )  # attention scores and sums
    out = 2 * b * t * d * vocab
    return 3.0 * (enc + dec + out)


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    """FLOP/s of a large square matrix product at `dtype`."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    reps = 20 if device.type == "cuda" else 5
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def get_batches(cfg, args, vocab_size: int, shapes: BatchShapes | None = None) -> list[Batch]:
    """The benchmark's batches: synthetic, or the run's first training batches, token-
    bucketed or (with `shapes`) in few shapes, as `mtkit train` would form them."""
    n = args.warmup + args.steps
    if args.synthetic:
        s, t = args.synthetic
        size = max(cfg.train.max_tokens // (max(s, t) + 1), 1)
        g = torch.Generator().manual_seed(0)
        pairs = [
            [
                (
                    torch.randint(4, vocab_size, (s,), generator=g).numpy(),
                    torch.randint(4, vocab_size, (t,), generator=g).numpy(),
                )
                for _ in range(size)
            ]
            for _ in range(n)
        ]
        return [collate(p) for p in pairs]
    data = ShardDataset(cfg.run_path / "data" / "train")
    if shapes is not None:
        order = shaped_batches(
            data.src_lengths, data.tgt_lengths, cfg.train.max_tokens, 1, 0, shapes
        )
        return [
            shaped_collate([data[i] for i in idx], shapes, cfg.train.max_tokens)
            for idx in order[:n]
        ]
    order = token_batches(data.src_lengths, data.tgt_lengths, cfg.train.max_tokens, 1, 0)
    return [collate([data[i] for i in idx]) for idx in order[:n]]


def time_training(step_fn, params, batches: list[Batch], args, device, autocast_dtype):
    """Tokens/s over the window after `args.warmup` steps, and peak memory."""
    # Fused AdamW on both sides: mtkit's own (`mtkit.training.optim.adamw`), and the Hugging Face
    # Trainer's default (`adamw_torch_fused` with torch >= 2.8).
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    tokens = 0
    with PeakMemory(device) as memory:
        for i, batch in enumerate(batches):
            if i == args.warmup:
                sync(device)
                start, tokens = time.perf_counter(), 0
            batch = batch.to(device)
            with amp:
                loss = step_fn(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += int((batch.tgt_out != PAD).sum())
        sync(device)
        elapsed = time.perf_counter() - start
    return tokens / elapsed, elapsed, memory.peak


def hf_marian(cfg: ModelConfig, vocab: int, attention: str):
    from transformers import MarianConfig, MarianMTModel

    hf_cfg = MarianConfig(
        vocab_size=vocab,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.heads,
        decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.ffn_dim,
        decoder_ffn_dim=cfg.ffn_dim,
        dropout=cfg.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions,
        scale_embedding=True,
        pad_token_id=PAD,
        decoder_start_token_id=2,
        eos_token_id=3,
        share_encoder_decoder_embeddings=True,
        attn_implementation=attention,
    )
    return MarianMTModel(hf_cfg)


def hf_throughput(
    cfg, vocab: int, attention: str, batches, args, device, dtype
) -> tuple[float, int]:
    """(tokens/s, peak memory) of the Marian model with one attention implementation."""
    torch.manual_seed(0)
    hf = hf_marian(cfg.model, vocab, attention).to(device).train()
    eps = cfg.train.label_smoothing

    def hf_step(batch: Batch) -> torch.Tensor:
        logits = hf(
            input_ids=batch.src, attention_mask=batch.src != PAD, decoder_input_ids=batch.tgt_in
        ).logits
        return F.cross_entropy(
            logits.float().view(-1, logits.size(-1)),
            batch.tgt_out.view(-1),
            ignore_index=PAD,
            label_smoothing=eps,
        )

    rate, _, peak = time_training(hf_step, list(hf.parameters()), batches, args, device, dtype)
    return rate, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted config override, as mtkit's --set; docs/performance.md's "
        "figures used train.max_tokens=4096",
    )
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--synthetic", type=int, nargs=2, metavar=("S", "T"))
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="with --synthetic: vocabulary size (default tokenizer.vocab_size)",
    )
    parser.add_argument(
        "--batch-shapes",
        choices=["auto", "exact", "classes"],
        default=None,
        help="mtkit's batches (default: the config's train.batch_shapes); "
        "Hugging Face runs on token batches and, where mtkit's are in "
        "few shapes, on those too, and its faster counts",
    )
    parser.add_argument("--compare", choices=["hf"], default=None)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time each side this many times, taking turns (mtkit, then "
        "each Hugging Face setting); figures are medians",
    )
    parser.add_argument(
        "--attention",
        choices=["auto", "sdpa", "matmul"],
        default=None,
        help="mtkit's attention kernel (default: the config's train.attention)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    cfg = load_config(args.config, args.set)
    precision = args.precision or cfg.train.precision
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
    device = resolve_device(args.device)
    if device.type == "cpu":
        tune_cpu_runtime()
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast_dtype, calibration = resolve_precision(
        precision,
        device,
        calibration_shape(cfg.train.max_tokens, cfg.model.d_model, cfg.model.ffn_dim),
    )
    spm = cfg.run_path / "spm.model"
    vocab = (
        (args.vocab_size or cfg.tokenizer.vocab_size)
        if args.synthetic or not spm.exists()
        else len(Vocab.load(spm))
    )
    token_batches = get_batches(cfg, args, vocab, None)
    mean_length = (
        sum(int((b.tgt_out != PAD).sum()) for b in token_batches)
        / max(sum(b.tgt_out.size(0) for b in token_batches), 1)
        + 1
    )
    attention_shape = AttentionShape.of_run(
        cfg.train.max_tokens, mean_length, cfg.model.d_model, cfg.model.heads
    )
    attention = choose_attention(
        args.attention or cfg.train.attention, device, autocast_dtype, attention_shape
    )
    shaping = (
        {"shapes": "exact", "asked": "synthetic batches"}
        if args.synthetic
        else choose_batch_shapes(
            args.batch_shapes or cfg.train.batch_shapes,
            device,
            autocast_dtype,
            calibration_shape(cfg.train.max_tokens, cfg.model.d_model, cfg.model.ffn_dim),
            fresh_above=cfg.train.max_tokens,
            attention=(attention["kernel"], attention_shape),
        )
    )
    batches = (
        get_batches(cfg, args, vocab, BatchShapes(limit=cfg.model.max_positions))
        if shaping["shapes"] == "classes"
        else token_batches
    )

    def mtkit_throughput() -> tuple[float, float, int]:
        """(tokens/s, seconds timed, peak memory) of a fresh mtkit model."""
        torch.manual_seed(0)
        model = build_model(cfg.model, vocab, vocab).to(device).train()
        model.use_attention(attention["kernel"])

        def mtkit_step(batch: Batch) -> torch.Tensor:
            out = batch_loss(model, batch, cfg.train.label_smoothing)  # the trainer's own
            return out.loss / max(out.tokens, 1)

        return time_training(
            mtkit_step, list(model.parameters()), batches, args, device, autocast_dtype
        )

    # Each round times mtkit, then each Hugging Face setting, so that a slow spell of a
    # shared machine falls on both sides; the figures are medians over the rounds.
    hf_settings = []  # (name, dtype, batching, batches, attention)
    if args.compare == "hf":
        runs = {"hf_fp32": None}
        if autocast_dtype is not None:
            runs["hf_same_precision"] = autocast_dtype
        batchings = {"token": token_batches}
        if batches is not token_batches:
            batchings["classes"] = batches  # mtkit's, given to Hugging Face as well
        hf_settings = [
            (name, dtype, batching, theirs, attn)
            for name, dtype in runs.items()
            for batching, theirs in batchings.items()
            for attn in ("eager", "sdpa")
        ]
    mine, theirs_by_setting = [], {i: [] for i in range(len(hf_settings))}
    for _ in range(args.rounds):
        mine.append(mtkit_throughput())
        for i, (_, dtype, _, theirs, attn) in enumerate(hf_settings):
            theirs_by_setting[i].append(
                hf_throughput(cfg, vocab, attn, theirs, args, device, dtype)
            )
    rate, elapsed, _ = sorted(mine)[len(mine) // 2]  # the median run (upper of two)
    peak = max(p for _, _, p in mine)
    flops = sum(model_flops(cfg.model, vocab, b) for b in batches[args.warmup :]) / elapsed
    peak_dtype = autocast_dtype or torch.float32
    gemm = matmul_peak(device, peak_dtype)
    result = {
        "config": args.config,
        "device": str(device),
        "cpu": cpu_description(),
        "precision": "bf16" if autocast_dtype else "fp32",
        "attention": attention,
        "batch_shapes": shaping,
        **({"calibration": calibration.as_dict()} if calibration else {}),
        "batches": (
            f"synthetic {args.synthetic[0]}x{args.synthetic[1]}" if args.synthetic else "train"
        ),
        "steps": args.steps,
        "rounds": args.rounds,
        "mtkit_tokens_per_s": round(rate),
        **(
            {"mtkit_tokens_per_s_each_round": [round(r) for r, _, _ in mine]}
            if args.rounds > 1
            else {}
        ),
        "mtkit_peak_memory_mb": round(peak / 2**20),
        "mtkit_model_tflops": round(flops / 1e12, 3),
        "matmul_peak_tflops": round(gemm / 1e12, 3),
        "mtkit_utilisation": round(flops / gemm, 3),
    }
    best: dict[str, tuple] = {}  # name -> (median tokens/s, peak, attention, batching)
    for i, (name, _, batching, _, attn) in enumerate(hf_settings):
        rates = sorted(r for r, _ in theirs_by_setting[i])
        hf_rate, hf_peak = rates[len(rates) // 2], max(p for _, p in theirs_by_setting[i])
        tail = "" if batching == "token" else "_classes"
        result[f"{name}_{attn}{tail}_tokens_per_s"] = round(hf_rate)
        if args.rounds > 1:
            result[f"{name}_{attn}{tail}_tokens_per_s_each_round"] = [
                round(r) for r, _ in theirs_by_setting[i]
            ]
        if name not in best or hf_rate > best[name][0]:
            best[name] = (hf_rate, hf_peak, attn, batching)
    for name, (hf_rate, hf_peak, attn, batching) in best.items():
        result[f"{name}_attention"] = attn  # Hugging Face at its faster setting
        result[f"{name}_batches"] = batching
        result[f"{name}_tokens_per_s"] = round(hf_rate)
        result[f"{name}_peak_memory_mb"] = round(hf_peak / 2**20)
        result[f"speedup_vs_{name}"] = round(rate / hf_rate, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

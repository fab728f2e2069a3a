"""Where a training step's CPU time goes: `torch.profiler` over full training steps.

    python benchmarks/profile_train_step.py [--config configs/multi30k.yaml]
        [--precision bf16] [--attention sdpa|matmul] [--steps 5] [--synthetic 16 16]
        [--set train.max_tokens=4096] [--batch-shapes exact|classes] [--device cuda]

Runs `--warmup` untimed steps, then profiles `--steps` steps (forward, label-smoothed
loss, backward, AdamW) of the config's model on the same batches as
`train_throughput.py`, and prints one JSON line: the share of self CPU time in matrix
products (mm, addmm, bmm, linear, SDPA's kernels), in casts (`aten::_to_copy`,
`aten::copy_`) and the number of casts per step, and the 12 costliest operators. On a
CPU without bf16 instructions bf16 cannot be timed, but the counts still compare
variants. With `--device cuda` it profiles the GPU too, and adds the profiled step's wall
time, its time in GPU kernels, and the 8 operators whose kernels took the most (the
profiler slows the host, so compare the kernels' time with an unprofiled step's, as
`train_throughput.py` times it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from contextlib import nullcontext

import torch
from profile_decode import gpu_times  # a sibling script
from torch.profiler import ProfilerActivity, profile
from train_throughput import get_batches, sync

from mtkit.core.config import load_config
from mtkit.core.device import cpu_description, resolve_device, tune_cpu_runtime
from mtkit.core.vocab import Vocab
from mtkit.data.batching import BatchShapes
from mtkit.model.transformer import build_model
from mtkit.training.loop import batch_loss
from mtkit.tuning.precision import resolve_precision

MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
)
CASTS = ("aten::_to_copy", "aten::copy_")


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
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--attention", choices=["sdpa", "matmul"], default="sdpa")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--synthetic", type=int, nargs=2, metavar=("S", "T"))
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--batch-shapes",
        choices=["exact", "classes"],
        default="exact",
        help="token batches, or batches of few shapes (train.batch_shapes); "
        "with classes the profiled steps are the first --steps "
        "batches again, whose shapes the warm-up has met, as the dozen "
        "shapes of a long run are",
    )
    args = parser.parse_args()

    cfg = load_config(args.config, args.set)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=args.precision))
    device = resolve_device(args.device)
    if device.type == "cpu":
        tune_cpu_runtime()
    dtype, _ = resolve_precision(args.precision, device)
    spm = cfg.run_path / "spm.model"
    vocab = (
        (args.vocab_size or cfg.tokenizer.vocab_size)
        if args.synthetic or not spm.exists()
        else len(Vocab.load(spm))
    )
    shapes = BatchShapes(limit=cfg.model.max_positions) if args.batch_shapes == "classes" else None
    batches = [batch.to(device) for batch in get_batches(cfg, args, vocab, shapes)]
    profiled = batches[: args.steps] if shapes else batches[args.warmup :]
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, vocab).to(device).train()
    model.use_attention(args.attention)
    # as mtkit.training.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    amp = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()

    def step(batch) -> None:
        with amp:
            out = batch_loss(model, batch, cfg.train.label_smoothing)
        (out.loss / max(out.tokens, 1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[: args.warmup]:
        step(batch)
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        start = time.perf_counter()
        for batch in profiled:
            step(batch)
        sync(device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    share = {
        name: sum(e.self_cpu_time_total for e in events if e.key in names) / total
        for name, names in (("matmul", MATMUL), ("casts", CASTS))
    }
    casts = sum(e.count for e in events if e.key in CASTS) / args.steps
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    result = {
        "device": str(device),
        "cpu": cpu_description(),
        "precision": args.precision,
        "attention": args.attention,
        "batch_shapes": args.batch_shapes,
        "steps": args.steps,
        "ms_per_step": round(total / args.steps / 1e3, 1),
        "matmul_share": round(share["matmul"], 3),
        "cast_share": round(share["casts"], 3),
        "casts_per_step": round(casts),
        "top": {e.key: round(e.self_cpu_time_total / total, 3) for e in top},
    }
    if device.type == "cuda":  # the CPU's time is the host's: the step's is the wall's
        kernels, operators = gpu_times(events)
        steps = len(profiled)
        result["profiled_wall_ms_per_step"] = round(wall / steps * 1e3, 1)
        result["gpu_kernel_ms_per_step"] = round(kernels / steps * 1e3, 1)
        result["top_gpu_ms_per_step"] = {k: round(v / steps * 1e3, 2) for k, v in operators.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

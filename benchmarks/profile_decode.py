"""Where batched beam search's time goes: a file translated cold and warm, and
`torch.profiler` over it.

    python benchmarks/profile_decode.py -m runs/multi30k/checkpoints/best.pt
        [--device cuda] [--beam 5] [--limit 1000] [--src data/multi30k/test2016.en.gz]
        [--attention engine|sdpa|matmul|sdpa-no-cudnn] [--precision P] [--shortlist]
        [--cuda-graphs auto|on|off] [--batch-tokens N] [--compare-eager] [--no-profile]

Warms the engine up on 100 other lines (`--warmup-src`: one-time costs, such as CUDA's
start, are not the file's), then translates `--limit` source lines twice, timed: cold,
as `mtkit translate` meets a new file, and warm, the same shapes again. Kernels built
for each new shape (oneDNN's bf16 and int8 products on a CPU, cuDNN's attention on a
GPU) are paid in the cold pass alone, so the two differ by what such building costs.
Each attention variant runs best in a process of its own (the kernel caches are the
process's). Then it translates once more under the profiler (the CPU, and CUDA where
the engine runs there), at the checkpoint's batch size, and prints one JSON line:
sentences/s of both timed passes; the profiled pass's operator calls per sentence; its
host-device waits (`aten::_local_scalar_dense`, the reading of a GPU value, and
`cudaStreamSynchronize` / `cudaMemcpyAsync`) per sentence; on CUDA its time in GPU
kernels, as a share of the warm pass's wall time (the profiler slows the host, not the
GPU; a small share means the search is bound by the host: Python and operator dispatch),
and the operators whose kernels took the most; and the 12 operators with the most self
CPU time. On a CPU, the share of matrix products says how much of a
step is the model and how much the search around it.

`--cuda-graphs` (default: the checkpoint's decode.cuda_graphs) decodes in fixed shapes
with captured steps (`mtkit.search.captured`); the line then says how many steps were
replayed and how many ran eagerly. `--compare-eager` translates the file once more with
an engine of eager steps (cuda_graphs off, the same batch budget) and counts the
outputs whose tokens are identical, with the largest score difference. The batch budget
is the engine's (`TorchEngine.batch_tokens`: sized for the GPU's memory on CUDA) unless
`--batch-tokens` gives one. On CUDA the line has the peak GPU memory of the timed passes.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from train_throughput import sync  # noqa: I001 (sibling scripts)
from translate_speed import read_source

from mtkit.core.device import cpu_description, tune_cpu_runtime
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine
from mtkit.search import beam as beam_module

MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_int_mm",
)
WAITS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaMemcpyAsync")


def device_time(event) -> float:
    """An event's self time on the GPU in microseconds (the attribute was renamed): a
    kernel's own time, or an operator's kernels' (those it launched itself)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return 0.0


def gpu_times(events) -> tuple[float, dict[str, float]]:
    """The seconds the GPU spent in kernels, and the operators that launched the most of
    it (seconds each, the 8 largest). Each kernel appears twice among the events, as
    itself and in its operator's self time, so the total counts kernels alone."""
    kernels = sum(device_time(e) for e in events if e.device_type != DeviceType.CPU)
    operators = sorted(
        (e for e in events if e.device_type == DeviceType.CPU), key=lambda e: -device_time(e)
    )[:8]
    return kernels / 1e6, {e.key[:60]: device_time(e) / 1e6 for e in operators}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--warmup-src", default="data/multi30k/val.en.gz")
    parser.add_argument(
        "--attention",
        default="engine",
        choices=["engine", "sdpa", "matmul", "sdpa-no-cudnn"],
        help="the engine's own choice, or another kernel; sdpa-no-cudnn: "
        "SDPA with cuDNN's attention left out of its backends",
    )
    parser.add_argument(
        "--precision",
        default=None,
        help="fp32|bf16|int8|auto (default: the checkpoint's decode.precision)",
    )
    parser.add_argument("--shortlist", action="store_true", help="the model's lexical shortlist")
    parser.add_argument(
        "--read-every",
        type=int,
        default=0,
        help="steps between the host's reads of which sentences are done, on a GPU "
        "(default: beam search's READ_EVERY_ON_GPU); 1 reads every step, as on a CPU",
    )
    parser.add_argument("--cuda-graphs", default=None, choices=["auto", "on", "off"])
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--compare-eager", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    if args.read_every:
        beam_module.READ_EVERY_ON_GPU = args.read_every

    lines = read_source(args.src, args.limit)
    if not Path(args.model).is_dir():  # as `mtkit translate` does for a checkpoint
        tune_cpu_runtime()
    engine = load_engine(
        args.model, args.device, precision=args.precision, cuda_graphs=args.cuda_graphs
    )
    device = torch.device(str(engine.device))
    batch_tokens = args.batch_tokens or engine.batch_tokens
    if args.attention != "engine":
        for model in engine.models:
            model.use_attention("matmul" if args.attention == "matmul" else "sdpa")

    def backends():  # a new context each time: sdpa_kernel's is used once
        if args.attention != "sdpa-no-cudnn":
            return nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(
            [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        )

    opts = SearchOptions(beam=args.beam, shortlist=args.shortlist)

    outputs: list = []

    def timed() -> float:
        sync(device)
        start = time.perf_counter()
        with backends():
            outputs[:] = engine.translate(lines, opts, batch_tokens=batch_tokens)
        sync(device)
        return time.perf_counter() - start

    with backends():
        engine.translate(read_source(args.warmup_src, 100), opts, batch_tokens=batch_tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cold, warm = timed(), timed()
    n = len(lines)
    target_tokens = sum(len(nbest[0].tokens) + 1 for nbest in outputs if nbest)  # and eos
    result = {
        "model": args.model,
        "device": str(device),
        "cpu": cpu_description(),
        "precision": engine.precision["precision"],
        "attention": args.attention,
        "engine_attention": engine.precision.get("attention"),
        "beam": args.beam,
        "shortlist": args.shortlist,
        "read_every": beam_module.READ_EVERY_ON_GPU if device.type == "cuda" else 1,
        "sentences": n,
        "cold_sentences_per_s": round(n / cold, 1),
        "warm_sentences_per_s": round(n / warm, 1),
        "warm_target_tokens_per_s": round(target_tokens / warm),
        "batch_tokens": batch_tokens,
        "cuda_graphs": engine.precision.get("graphs"),
        "decoder_steps": engine.graph_record() if hasattr(engine, "graph_record") else None,
    }
    if device.type == "cuda":
        result["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if args.compare_eager:
        eager = load_engine(args.model, args.device, precision=args.precision, cuda_graphs="off")
        if args.attention != "engine":
            for model in eager.models:
                model.use_attention("matmul" if args.attention == "matmul" else "sdpa")
        with backends():
            want = eager.translate(lines, opts, batch_tokens=batch_tokens)
        pairs = [(g, w) for got, wanted in zip(outputs, want) for g, w in zip(got, wanted)]
        result["identical_to_eager"] = f"{sum(g.tokens == w.tokens for g, w in pairs)}/{len(pairs)}"
        result["max_score_difference"] = max((abs(g.score - w.score) for g, w in pairs), default=0)
    if args.no_profile:
        print(json.dumps(result))
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof, backends():
        start = time.perf_counter()
        engine.translate(lines, opts)
        sync(device)
        profiled_wall = time.perf_counter() - start
    events = prof.key_averages()
    cpu_total = sum(e.self_cpu_time_total for e in events)
    result |= {
        "profiled_wall_s": round(profiled_wall, 2),
        "operator_calls_per_sentence": round(sum(e.count for e in events) / n, 1),
        "waits_per_sentence": {
            k: round(sum(e.count for e in events if e.key == k) / n, 2) for k in WAITS
        },
        "matmul_share_of_cpu_time": round(
            sum(e.self_cpu_time_total for e in events if e.key in MATMUL) / cpu_total, 3
        ),
        "top_cpu": {
            e.key: round(e.self_cpu_time_total / cpu_total, 3)
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
        },
    }
    if device.type == "cuda":  # the share of the warm pass's time, without the profiler
        kernels, operators = gpu_times(events)
        result["gpu_kernel_s"] = round(kernels, 3)
        result["gpu_busy_share"] = round(kernels / warm, 3)
        result["top_gpu_s"] = {k: round(v, 4) for k, v in operators.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

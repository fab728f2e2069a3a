"""Compiled decoder steps on a CPU (`--compile`, `mtkit.search.compiled`) against eager
ones: sentences/s, compile time and the share of outputs identical to eager steps, greedy
and beam 5.

    python benchmarks/compiled_steps.py -m runs/multi30k/checkpoints/average.pt \\
        [--src data/multi30k/test2016.en.gz] [--limit 1000] [--beams 1 5]
        [--precision fp32|bf16|int8] [--threads N] [--rounds 2] [--auto]

In this process, for each beam, it translates the lines with eager steps (the model's
own), then through a `CompiledDecoder`: first cold (the step compiled on its first
meeting; compile time is the cold run's time less the best warm one's), then
`--rounds` warm runs taking turns with eager ones (each side its fastest). Both at the
engine's batch size and `--precision` (eager's too: "identical" is to eager steps in
that precision), on `--threads` threads (default: all of torch's). Inductor's disk
cache is PyTorch's own (`TORCHINDUCTOR_CACHE_DIR`, a folder per vector ISA): a second
run of this script finds it warm, as a second `mtkit translate` does. With `--auto` it
runs `--compile auto`'s own measurement instead (`compile_choice`, nothing kept). It
prints one JSON line, with the CPU and the load average.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from dataclasses import replace

import torch

from mtkit.core.device import cpu_description
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine
from mtkit.engines.pytorch_loading import compiled_shape
from mtkit.search.compiled import CompiledDecoder, compiled_step_timer
from mtkit.tuning.compile import compile_choice


def timed(engine, lines: list[str], opts: SearchOptions) -> tuple[float, list]:
    start = time.perf_counter()
    out = engine.translate(lines, opts)
    return time.perf_counter() - start, [h[0].tokens for h in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--auto", action="store_true", help="auto's measurement instead")
    parser.add_argument("--precision", default="fp32", help="fp32, bf16 or int8 (eager's too)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with gzip.open(args.src, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f][: args.limit]
    engine = load_engine(args.model, "cpu", precision=args.precision, workers=1, compile="off")
    model, decode = engine.models[0], engine.config.decode
    report = {"cpu": cpu_description(), "lines": len(lines), "threads": args.threads}
    report["precision"] = engine.precision["precision"]
    if args.auto:
        report["auto"] = compile_choice(
            "auto",
            torch.device("cpu"),
            {"model": compiled_shape(model, len(engine.src_vocab)), "precision": args.precision},
            compiled_step_timer(model, len(engine.src_vocab), decode.batch_tokens, decode.beam),
        )
    for beam in [] if args.auto else args.beams:
        opts = replace(SearchOptions.from_config(decode), beam=beam)
        engine.steppers = [model]
        timed(engine, lines[:100], opts)  # warmed up
        eager_s, eager = timed(engine, lines, opts)
        compiled = CompiledDecoder(model)
        engine.steppers = [compiled]
        cold_s, _ = timed(engine, lines, opts)
        warm = []
        for _ in range(args.rounds):
            engine.steppers = [model]
            eager_s = min(eager_s, timed(engine, lines, opts)[0])
            engine.steppers = [compiled]
            warm_s, out = timed(engine, lines, opts)
            warm.append(warm_s)
        report[f"beam{beam}"] = {
            "eager_sent_s": round(len(lines) / eager_s, 1),
            "compiled_sent_s": round(len(lines) / min(warm), 1),
            "speedup": round(eager_s / min(warm), 3),
            "identical": round(sum(a == b for a, b in zip(out, eager)) / len(out), 4),
            "compile_s": round(cold_s - min(warm), 1),
            **compiled.record(),
        }
        print(json.dumps({f"beam{beam}": report[f"beam{beam}"]}), flush=True)
    engine.steppers = [model]
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report))


if __name__ == "__main__":
    main()

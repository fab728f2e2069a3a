"""Compiled decoder steps on a CPU (`--compile`) against eager ones: sentences/s, compile
time and the share of outputs identical to eager fp32, greedy and beam 5, on one thread.

    python benchmarks/compiled_steps.py -m runs/multi30k/checkpoints/average.pt \\
        [--src data/multi30k/test2016.en.gz] [--limit 300] [--beams 1 5] [--precision bf16]
        [--auto]

For each beam it translates the lines three ways in this process, in fp32 (or
`--precision bf16`, eager's too: "identical" is then to eager bf16): eager (the
default search, growing caches), in fixed shapes with eager steps (the captured decoder
with a capture that records nothing: what the fixed shapes cost by themselves), and
compiled (`tuning.compile.inductor_capture`), first cold (compiling each shape it meets),
then again warm; compile time is the cold run's time less the warm one's. Each compiled
pass starts with nothing compiled: shapes past `COMPILED_SHAPES` run eagerly (its
`eager_steps`). With `--auto` it runs `--compile auto`'s own measurement instead
(`compile_choice`, nothing kept). It prints one JSON line, with the CPU and the load
average.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time

import torch

from mtkit.core.device import cpu_description
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine
from mtkit.engines.pytorch_loading import compiled_shape
from mtkit.search.captured import CapturedDecoder, compiled_step_timer
from mtkit.tuning.compile import compile_choice, inductor_capture


def eager_capture(step):
    """A capture that records nothing: each replay runs the step eagerly."""
    return step


def timed(engine, lines: list[str], opts: SearchOptions) -> tuple[float, list]:
    start = time.perf_counter()
    out = engine.translate(lines, opts)
    return time.perf_counter() - start, [h[0].tokens for h in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--auto", action="store_true", help="auto's measurement instead")
    parser.add_argument("--precision", default="fp32", help="fp32 or bf16 (eager's too)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with gzip.open(args.src, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f][: args.limit]
    engine = load_engine(args.model, "cpu", precision=args.precision, workers=1, compile="off")
    model, decode = engine.models[0], engine.config.decode
    report = {"cpu": cpu_description(), "lines": len(lines), "threads": 1}
    report["precision"] = args.precision
    if args.auto:
        report["auto"] = compile_choice(
            "auto",
            torch.device("cpu"),
            {"model": compiled_shape(model, len(engine.src_vocab)), "precision": args.precision},
            compiled_step_timer(
                model, inductor_capture, len(engine.src_vocab), decode.batch_tokens, decode.beam
            ),
        )
    for beam in [] if args.auto else args.beams:
        opts = SearchOptions(beam=beam)
        timed(engine, lines[:20], opts)  # warmed up
        eager_s, eager = timed(engine, lines, opts)
        row = {"eager_sent_s": round(len(lines) / eager_s, 1)}
        for name, capture in (("fixed_eager", eager_capture), ("compiled", inductor_capture)):
            torch._dynamo.reset()  # each pass its own `COMPILED_SHAPES`
            engine.steppers = [CapturedDecoder(model, capture)]
            cold_s, _ = timed(engine, lines, opts)
            warm_s, out = timed(engine, lines, opts)
            row[f"{name}_sent_s"] = round(len(lines) / warm_s, 1)
            row[f"{name}_identical"] = round(sum(a == b for a, b in zip(out, eager)) / len(out), 4)
            row[f"{name}_shapes"] = engine.steppers[0].record()["shapes"]
            row[f"{name}_eager_steps"] = engine.steppers[0].record()["eager_steps"]
            if name == "compiled":
                row["compile_s"] = round(cold_s - warm_s, 1)
        engine.steppers = [model]
        report[f"beam{beam}"] = row
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report))


if __name__ == "__main__":
    main()

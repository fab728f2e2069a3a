"""Peak memory (RSS) of the training and pipeline commands, each a process of its own.

    python benchmarks/memory.py [--config configs/multi30k.yaml] [--steps 120]
        [--valid-every 100] [--only train-fp32,train-bf16,run]

Prepares a run directory once (tokenizer, preprocess) in a temporary folder, then runs
`mtkit train` in fp32 and in bf16 (forced: without bf16 instructions a step takes about
a minute there, but memory does not depend on speed) for `--steps` updates with one
validation, and `mtkit run` (precision as the config says, `auto` in the main job's),
which trains as long, averages, translates the test set and scores it. Each figure is
the process's own peak RSS (VmHWM). Prints one JSON line with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_throughput import process_peak_rss_mb  # noqa: I001 (a sibling script)

from mtkit.core.device import cpu_description

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k.yaml"))
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--valid-every", type=int, default=100)
    parser.add_argument("--only", default="train-fp32,train-bf16,run")
    args = parser.parse_args()
    wanted = args.only.split(",")
    result: dict = {"cpu": cpu_description(), "config": args.config, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared"
        sets = ["--set", f"run_dir={prepared}"]
        for stage in ("tokenizer", "preprocess"):
            subprocess.run(
                [sys.executable, "-m", "mtkit", "-q", stage, "-c", args.config, *sets],
                check=True,
                cwd=ROOT,
            )
        limits = [
            f"train.max_steps={args.steps}",
            "train.max_time=0",
            f"train.valid_every={args.valid_every}",
        ]
        for name in wanted:
            run = Path(tmp) / name
            shutil.copytree(prepared, run)
            sets = [x for s in [f"run_dir={run}", *limits] for x in ("--set", s)]
            if name.startswith("train-"):
                command = [
                    "-q",
                    "train",
                    "-c",
                    args.config,
                    *sets,
                    "--set",
                    f"train.precision={name.removeprefix('train-')}",
                ]
            elif name == "run":
                command = ["-q", "run", "-c", args.config, *sets]
            else:
                parser.error(f"--only: unknown {name!r} (train-fp32, train-bf16, run)")
            start = time.perf_counter()
            result[f"{name}_peak_rss_mb"] = round(process_peak_rss_mb(command))
            result[f"{name}_s"] = round(time.perf_counter() - start, 1)
            if name == "run":
                start_event = json.loads((run / "metrics.jsonl").open().readline())
                result["run_precision"] = start_event["precision"]
            print(
                json.dumps({k: v for k, v in result.items() if k.startswith(name)}),
                file=sys.stderr,
                flush=True,
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

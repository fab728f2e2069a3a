"""Ablations at an equal number of updates: one `mtkit run` per variant of a config, each
for the same --steps (or its own), sharing one tokenizer and one set of shards, then one
Markdown table of what each variant reached.

    python benchmarks/ablation.py --config configs/multi30k.yaml --steps 437 \\
        --variant base= --variant "batch 2048@874=train.max_tokens=2048" \\
        --variant "no dropout=model.dropout=0.0" [--precision bf16] [--avx2] [--out DIR]

A variant is `NAME[@STEPS]=OVERRIDE,OVERRIDE,...` (dotted overrides as in `--set`; none
for the config as it is). Each run trains from scratch to its number of updates with
`max_time` off, so the comparison does not depend on the machine's speed or on what else
runs on it; `wall` in the table does. `--avx2` runs each training as a CPU without
AVX-512 would (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`: AVX2 kernels, bf16
emulated, so use it with fp32) to time the main job's budget as such a machine gives it.
A variant whose directory already holds a test.scores.json is read, not rerun (remove
the directory to run it again).

Columns: the final model's greedy validation BLEU (what the trainer logs), test BLEU of
the checkpoint `mtkit run` scores (the mean of the last train.average_last, beam search as
in the config's decode section), seconds of training, and the precision it ran in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def parse_variant(text: str, steps: int) -> tuple[str, int, list[str]]:
    """`NAME[@STEPS]=a.b=1,c.d=2` -> (name, steps, ["a.b=1", "c.d=2"])."""
    head, _, overrides = text.partition("=")
    name, _, own = head.partition("@")
    return name.strip(), int(own) if own else steps, [o for o in overrides.split(",") if o]


def mtkit(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [sys.executable, "-m", "mtkit", "-q", *args],
        cwd=ROOT,
        check=True,
        env={**os.environ, **(env or {})},
    )


def prepare(config: str, shared: Path) -> None:
    """The tokenizer and the shards, once, for every variant."""
    if not (shared / "data" / "train" / "manifest.json").exists():
        for stage in ("tokenizer", "preprocess"):
            mtkit(stage, "--config", config, "--set", f"run_dir={shared}")


def run_variant(
    config: str,
    shared: Path,
    run: Path,
    steps: int,
    overrides: list[str],
    precision: str,
    avx2: bool,
) -> None:
    if not run.exists():
        run.mkdir(parents=True)
        shutil.copytree(shared / "data", run / "data")
        for spm in shared.glob("spm*"):
            shutil.copy(spm, run / spm.name)
    sets = [
        f"run_dir={run}",
        "train.max_time=0",
        f"train.max_steps={steps}",
        f"train.precision={precision}",
        f"decode.precision={precision}",
        *overrides,
    ]
    mtkit(
        "run",
        "--config",
        config,
        *[a for s in sets for a in ("--set", s)],
        env=AVX2 if avx2 else None,
    )


def summary(run: Path) -> dict:
    events = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    start = next(e for e in events if e["event"] == "start")
    end = [e for e in events if e["event"] == "end"][-1]
    valid = [e["valid_bleu"] for e in events if e["event"] == "valid"]
    test = json.loads((run / "test.scores.json").read_text())
    return {
        "updates": end["step"],
        "valid_bleu": valid[-1] if valid else None,
        "test_bleu": test["bleu"]["score"],
        "train_s": round(end["time"] - start["time"]),
        "precision": start["precision"],
        "cpu": start.get("cpu", ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--avx2", action="store_true")
    parser.add_argument("--out", default="runs/ablation")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    prepare(args.config, out / "_shared")
    rows = []
    for text in args.variant:
        name, steps, overrides = parse_variant(text, args.steps)
        run = out / name.replace(" ", "_")
        if not (run / "test.scores.json").exists():
            run_variant(
                args.config, out / "_shared", run, steps, overrides, args.precision, args.avx2
            )
        row = {"variant": name, "overrides": overrides, **summary(run)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| variant | overrides | updates | valid BLEU | test BLEU | training s | precision |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(
            f"| {r['variant']} | {' '.join(r['overrides']) or '-'} | {r['updates']} | "
            f"{r['valid_bleu']} | {r['test_bleu']:.2f} | {r['train_s']} | {r['precision']} |"
        )
    print(f"\nCPU: {rows[0]['cpu']}{' (AVX2 kernels forced)' if args.avx2 else ''}")


if __name__ == "__main__":
    main()

"""A/B of the whole training loop at two revisions: the same bilingual run, the same
steps, interleaved (A, B, A, B, ...), comparing tokens/s and the losses themselves.

    python benchmarks/ab_train.py --base REV_A --head REV_B [--steps 100] [--rounds 2]
        [--config configs/multi30k.yaml]

Each revision is checked out into a temporary git worktree and runs `mtkit tokenizer`
and `mtkit preprocess` once into its own run directory, then `mtkit train` from scratch
(checkpoints removed) for --steps updates each round, in its own process started in
its worktree with PYTHONPATH set to it (checked: that process imports the worktree's
mtkit; until 2026-12-02 it ran from the checkout and imported the checkout's on both
sides), on the same config file (whose relative data paths then read each worktree's
own copy of the tracked corpora). `train_throughput.py` times the model's step alone; this
times what the trainer adds around it (sampling, batching, logging, checkpoints at
train.save_every), and shows whether the two revisions train the same model: with the
same seed and precision (fp32 by default here, the same on every CPU) the logged losses
must be equal. Prints one JSON line per run and a summary: the median tokens/s of each
side, their ratio (B/A), and whether every logged loss matched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mtkit(tree: Path, *args: str) -> None:
    """`mtkit ARGS` run from the worktree `tree`, in it: `python -m` puts the working
    directory first on sys.path, ahead of PYTHONPATH, so run from the repository root it
    would import the checkout's own mtkit on both sides."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "mtkit", "-q", *args], cwd=tree, env=env, check=True)


def imported_from(tree: Path) -> Path:
    """Where `mtkit` is imported from when run as `mtkit` runs it for `tree`."""
    out = subprocess.run(
        [sys.executable, "-c", "import mtkit; print(mtkit.__file__)"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out).resolve()


def train_events(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--head", required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    config = str((ROOT / args.config).resolve())  # both sides train this one config
    work = Path(tempfile.mkdtemp(prefix="ab-train-"))
    sides = {}
    try:
        for label, rev in (("A", args.base), ("B", args.head)):
            tree = work / f"tree-{label}"
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=ROOT, check=True
            )
            if not imported_from(tree).is_relative_to(tree.resolve()):
                raise SystemExit(
                    f"side {label} would not run {rev}'s mtkit but {imported_from(tree)}"
                )
            run = work / f"run-{label}"
            sets = [
                "--set",
                f"run_dir={run}",
                "--set",
                f"train.max_steps={args.steps}",
                "--set",
                "train.max_time=0",
                "--set",
                f"train.precision={args.precision}",
                "--set",
                f"train.log_every={max(args.steps // 4, 1)}",
                "--set",
                f"train.valid_every={args.steps * 10}",
            ]
            mtkit(tree, "tokenizer", "-c", config, *sets)
            mtkit(tree, "preprocess", "-c", config, *sets)
            sides[label] = (tree, run, sets, [])
        for round_ in range(args.rounds):
            for label, (tree, run, sets, results) in sides.items():
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
                (run / "metrics.jsonl").unlink(missing_ok=True)
                mtkit(tree, "train", "-c", config, *sets)
                events = train_events(run)
                results.append(events)
                print(
                    json.dumps(
                        {
                            "side": label,
                            "round": round_,
                            "tokens_per_s": events[-1]["tokens_per_s"],
                            "losses": [e["loss"] for e in events],
                        }
                    ),
                    flush=True,
                )
        speed = {
            label: statistics.median(r[-1]["tokens_per_s"] for r in results)
            for label, (_, _, _, results) in sides.items()
        }
        losses = {
            label: [[e["loss"] for e in r] for r in results]
            for label, (_, _, _, results) in sides.items()
        }
        same = all(a == b for a in losses["A"] for b in losses["B"])
        print(
            json.dumps(
                {
                    "tokens_per_s": speed,
                    "ratio": round(speed["B"] / speed["A"], 3),
                    "losses_identical": same,
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "precision": args.precision,
                }
            )
        )
    finally:
        for label in sides:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(work / f"tree-{label}")], cwd=ROOT
            )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""`mtkit translate` under torchrun: N ranks of one thread each against one process of one
thread, on the same file, with identical bytes (`mtkit.engines.ranks`).

Issue 81's goal: 2 ranks of one thread each on a 2-core machine translate a 10,000-line
file at 1.8x or more the throughput of 1 rank of one thread, and write the same bytes.

    python benchmarks/ranks.py                               # the main job's model, 10,000 lines
    python benchmarks/ranks.py --lines 2000 --ranks 2 --rounds 1

The input is the first --lines lines of Multi30k's training source (data/multi30k,
train.en.gz). Each command runs as a user runs it, `python -m mtkit translate -i IN -o OUT
--workers 1` with OMP_NUM_THREADS=1, alone or under `python -m torch.distributed.run
--standalone --nproc_per_node N`; its wall time counts everything, from the start of
Python to the output in place (imports, the model's load, the rendezvous, the parts put
together). A short translation first makes the measured choices (precision, attention
kernel) that both then take from one cache folder in the work folder. Each figure is the
best of --rounds. The machine's load average is printed beside the figures: other jobs
on the same cores slow one process and N ranks differently.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtkit.core.device import cpu_description

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "data" / "multi30k" / "train.en.gz"


def _timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds `command` ran (it must succeed)."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="runs/multi30k/checkpoints/average.pt")
    ap.add_argument("--lines", type=int, default=10_000, help="lines of train.en translated")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each; the best counts")
    ap.add_argument("--work", help="keep the inputs and outputs here (default: a temporary)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="mtkit-ranks-"))
    work.mkdir(parents=True, exist_ok=True)
    with gzip.open(SOURCE, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(args.lines)]
    source = work / "in.en"
    source.write_text("".join(lines), encoding="utf-8")
    (work / "warm.en").write_text("".join(lines[:50]), encoding="utf-8")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MTKIT_CACHE_DIR": str(work / "measured"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model

    def translate(out: Path, input: Path = source) -> list[str]:
        return ["-m", "mtkit", "-q", "translate", "-m", model, "-i", str(input), "-o", str(out)]

    alone = [sys.executable, *translate(work / "warm.de", work / "warm.en"), "--workers", "1"]
    _timed(alone, env)  # the measured choices, made once
    one_s, ranks_s = [], []
    for _ in range(args.rounds):
        one_s.append(_timed([sys.executable, *translate(work / "one.de"), "--workers", "1"], env))
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={args.ranks}",
        ]
        ranks = [*torchrun, *translate(work / "ranks.de"), "--workers", "1"]  # (-m mtkit)
        ranks_s.append(_timed(ranks, env))
    same = (work / "one.de").read_bytes() == (work / "ranks.de").read_bytes()
    figures = {
        "cpu": cpu_description(),
        "lines": args.lines,
        "ranks": args.ranks,
        "one_rank_s": round(min(one_s), 2),
        "ranks_s": round(min(ranks_s), 2),
        "one_rank_sentences_per_s": round(args.lines / min(one_s), 1),
        "ranks_sentences_per_s": round(args.lines / min(ranks_s), 1),
        "speedup": round(min(one_s) / min(ranks_s), 3),
        "identical_bytes": same,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{figures['cpu']}; load average {figures['load_average']}")
    print(
        f"{args.lines:,} lines, one thread a process: 1 rank {figures['one_rank_s']} s "
        f"({figures['one_rank_sentences_per_s']} sentences/s), {args.ranks} ranks "
        f"{figures['ranks_s']} s ({figures['ranks_sentences_per_s']} sentences/s): "
        f"{figures['speedup']}x; identical bytes: {same}"
    )


if __name__ == "__main__":
    main()

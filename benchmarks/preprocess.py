"""Tokenizer and preprocessing at scale: wall time, pairs/s and peak memory per stage.

    python benchmarks/preprocess.py [--pairs N] [--config configs/multi30k.yaml]
                                    [--max-tokens 4096] [--workers W] [--keep DIR]

Without `--pairs` it runs on the config's own corpus. With `--pairs N` it builds the
synthetic corpus in a temporary folder: the embedded Multi30k training pairs
repeated with a numbered suffix (" 17" on both sides), so no two of the N pairs are
equal, as two plain text files. Valid and test stay the config's.

Each stage runs as its own `mtkit` process (`tokenizer`, then `preprocess`, and with
`--train` one step of `mtkit train`, timed from launch to the step). Peak RSS is
of the whole process tree (encoding workers included), sampled every 20 ms. Then one
epoch of token-bucketed batches is formed from the shard, as `mtkit train` does at start,
and its padding share is reported next to a sentence-count batcher (random batches of
the same mean size). Prints one JSON line. Goals (at 4.5M pairs): preprocess
peak RSS <= 1 GB, >= 50,000 pairs/s; tokenizer <= 60 s; padding < 5%; train's first
step within 30 s of launch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtkit.data.batching import token_batches  # noqa: E402
from mtkit.data.shards import ShardDataset  # noqa: E402


def padding_share(
    batches: list[np.ndarray], src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> float:
    """Share of padded positions over all batches, counting source and target tensors."""
    padded = real = 0
    for b in batches:
        s, t = src_lengths[b] + 1, tgt_lengths[b] + 1
        padded += len(b) * (s.max() + t.max())
        real += s.sum() + t.sum()
    return float(1 - real / padded) if padded else 0.0


def synthetic_corpus(folder: Path, pairs: int, src_gz: Path, tgt_gz: Path) -> tuple[Path, Path]:
    """N pairs: the base corpus's pairs in order, again and again, each with " <i>"."""
    with gzip.open(src_gz, "rt", encoding="utf-8") as f:
        src = f.read().splitlines()
    with gzip.open(tgt_gz, "rt", encoding="utf-8") as f:
        tgt = f.read().splitlines()
    out = folder / "synthetic.en", folder / "synthetic.de"
    with open(out[0], "w", encoding="utf-8") as fs, open(out[1], "w", encoding="utf-8") as ft:
        for start in range(0, pairs, 100_000):
            rows = range(start, min(start + 100_000, pairs))
            fs.write("".join(f"{src[i % len(src)]} {i}\n" for i in rows))
            ft.write("".join(f"{tgt[i % len(tgt)]} {i}\n" for i in rows))
    return out


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants."""
    tree, todo, total = _children(), [pid], 0
    while todo:
        p = todo.pop()
        todo += tree.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run_stage(args: list[str]) -> dict:
    """Run `mtkit ARGS`; its wall time and the peak RSS of its process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtkit", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode:
        sys.exit(f"mtkit {' '.join(args)} failed:\n{err}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 2**20)}


def first_step(common: list[str], run_dir: Path) -> dict:
    """`mtkit train` for one step: seconds from launch to its first step's record in
    metrics.jsonl (start-up: opening and verifying the shards, the sampler, the model),
    and the peak RSS of the run."""
    launched = time.time()
    stats = run_stage(
        [
            "train",
            *common,
            "--no-resume",
            "--set",
            "train.max_steps=1",
            "--set",
            "train.log_every=1",
            "--set",
            "train.valid_every=1000000",
            "--set",
            "train.max_time=0",
        ]
    )
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "train" and record["step"] == 1:
            return {"first_step_s": round(record["time"] - launched, 2), **stats}
    sys.exit("no training step was logged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--pairs", type=int, default=0, help="synthetic corpus size")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=0, help="data.workers (0: config's)")
    parser.add_argument("--keep", help="build the run here and keep it (default: temp)")
    parser.add_argument(
        "--train", action="store_true", help="also time `mtkit train` from launch to its first step"
    )
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / args.config).read_text())

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run_dir = Path(args.keep).resolve() if args.keep else tmp / "run"
        sets = ["--set", f"run_dir={run_dir}"]
        if args.workers:
            sets += ["--set", f"data.workers={args.workers}"]
        if args.pairs:
            train = config["data"]["train"]
            src, tgt = synthetic_corpus(tmp, args.pairs, ROOT / train["src"], ROOT / train["tgt"])
            sets += ["--set", f"data.train.src={src}", "--set", f"data.train.tgt={tgt}"]
        common = ["-c", str(ROOT / args.config), *sets]
        tokenizer = run_stage(["tokenizer", *common])
        preprocess = run_stage(["preprocess", *common])
        train = first_step(common, run_dir) if args.train else None
        start = time.perf_counter()
        data = ShardDataset(run_dir / "data" / "train")
        src, tgt = data.src_lengths, data.tgt_lengths
        batches = token_batches(src, tgt, args.max_tokens, seed=1, epoch=0)
        sampler_s = time.perf_counter() - start
        ours = padding_share(batches, src, tgt)
        mean_size = len(data) / len(batches)
        order = np.random.default_rng(1).permutation(len(data))
        step = round(mean_size)
        naive = padding_share([order[i : i + step] for i in range(0, len(data), step)], src, tgt)
        manifests = {
            s: json.loads((run_dir / "data" / s / "manifest.json").read_text())
            for s in ("train", "valid", "test")
            if (run_dir / "data" / s).exists()
        }
    read = sum(c["read"] for m in manifests.values() for c in m["corpora"])
    print(
        json.dumps(
            {
                "pairs_read": read,
                "train_pairs": manifests["train"]["pairs"],
                "tokenizer": {**tokenizer, "pairs_per_s": round(read / tokenizer["wall_s"])},
                "preprocess": {**preprocess, "pairs_per_s": round(read / preprocess["wall_s"])},
                "open_and_batch_s": round(sampler_s, 2),
                **({"train": train} if train else {}),
                "max_tokens": args.max_tokens,
                "batches": len(batches),
                "mean_batch_pairs": round(mean_size, 1),
                "padding_share": round(ours, 4),
                "sentence_count_padding_share": round(naive, 4),
                "cpu": _cpu_model(),
            }
        )
    )


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()

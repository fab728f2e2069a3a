"""benchmarks/ablation.py: variants of a config at an equal number of updates, one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ablation(out: Path, *variants: str) -> list[str]:
    args = [
        sys.executable,
        str(ROOT / "benchmarks" / "ablation.py"),
        "--config",
        "configs/copy.yaml",
        "--steps",
        "20",
        "--out",
        str(out),
    ]
    for v in variants:
        args += ["--variant", v]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_each_variant_trains_its_updates_and_lands_in_one_table(tmp_path):
    lines = ablation(tmp_path, "base=", "slow lr@10=train.lr=0.0001,model.dropout=0.1")
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(r["variant"], r["updates"], r["precision"]) for r in rows] == [
        ("base", 20, "fp32"),
        ("slow lr", 10, "fp32"),
    ]
    assert rows[1]["overrides"] == ["train.lr=0.0001", "model.dropout=0.1"]
    config = (tmp_path / "slow_lr" / "config.yaml").read_text()
    assert "lr: 0.0001" in config and "max_time: 0" in config
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| variant | overrides | updates |")
    assert table[2].startswith("| base | - | 20 |")
    assert table[3].startswith("| slow lr | train.lr=0.0001 model.dropout=0.1 | 10 |")
    # One tokenizer and one set of shards for all: the variants' shards are copies of it.
    shared = (tmp_path / "_shared" / "data" / "train" / "manifest.json").read_bytes()
    assert (tmp_path / "base" / "data" / "train" / "manifest.json").read_bytes() == shared
    # A finished variant is read back, not trained again.
    before = (tmp_path / "base" / "metrics.jsonl").read_bytes()
    again = [json.loads(line) for line in ablation(tmp_path, "base=") if line.startswith("{")]
    assert again == rows[:1]
    assert (tmp_path / "base" / "metrics.jsonl").read_bytes() == before

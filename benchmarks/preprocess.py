"""Preprocessing throughput and batch padding on all of Multi30k train.

    python benchmarks/preprocess.py [--config configs/multi30k.yaml] [--max-tokens 4096]

Runs the real `mtkit tokenizer` and `mtkit preprocess` stages into a temporary run
directory and prints one JSON line: pairs/s for each stage, and the share of padded
positions over one epoch of token-bucketed batches, next to a sentence-count batcher
(random batches of the same mean size) for comparison. Goal: padding under 5%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time

import datasets
import numpy as np

from mtkit.config import load_config
from mtkit.data.batching import padding_share, token_batches
from mtkit.data.shards import ShardDataset, preprocess
from mtkit.tokenizer import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = dataclasses.replace(load_config(args.config), run_dir=run_dir)
        start = time.perf_counter()
        build_tokenizer(cfg)
        tokenizer_s = time.perf_counter() - start
        start = time.perf_counter()
        manifests = preprocess(cfg)
        preprocess_s = time.perf_counter() - start
        train = ShardDataset(cfg.run_path / "data" / "train")
        src, tgt = train.src_lengths, train.tgt_lengths
        batches = token_batches(src, tgt, args.max_tokens, seed=1, epoch=0)
        ours = padding_share(batches, src, tgt)
        mean_size = len(train) / len(batches)
        order = np.random.default_rng(1).permutation(len(train))
        step = round(mean_size)
        naive = padding_share([order[i:i + step] for i in range(0, len(train), step)], src, tgt)
    pairs = sum(m["pairs"] for m in manifests.values())
    print(json.dumps({
        "train_pairs": manifests["train"]["pairs"],
        "all_pairs": pairs,
        "tokenizer_s": round(tokenizer_s, 2),
        "preprocess_s": round(preprocess_s, 2),
        "preprocess_pairs_per_s": round(pairs / preprocess_s),
        "max_tokens": args.max_tokens,
        "batches": len(batches),
        "mean_batch_pairs": round(mean_size, 1),
        "padding_share": round(ours, 4),
        "sentence_count_padding_share": round(naive, 4),
    }))


if __name__ == "__main__":
    main()

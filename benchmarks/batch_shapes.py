"""Batches of few shapes against token batches: bf16 training tokens/s of one process.

    python benchmarks/batch_shapes.py [--shapes exact|classes] [--multiple 4] [--group 8]
        [--cache N] [--hf] [--steps 160] [--config configs/multi30k.yaml]

Trains --steps batches of the run's training data (run `mtkit preprocess` first) twice
over, in bf16 autocast with matmul attention, as `mtkit train` forms them: token batches
(`exact`) or batches of few shapes (`classes`: widths rounded up to --multiple, runs of
--group batches of one class). Prints one JSON line: how many distinct batch shapes the
steps met, the share of real target positions, tokens/s of each pass and the peak RSS.
--cache N sets both of oneDNN's kernel caches to N entries (mtkit's CLI keeps 32) before
oneDNN's first use; --hf trains Hugging Face's Marian model of the same size (eager
attention) on the same batches instead. Run one variant per process: the kernel caches are
the thing measured. This is how `train.batch_shapes` was designed
(docs/data.md#batches-of-few-shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--shapes", choices=["exact", "classes"], default="classes")
    parser.add_argument("--multiple", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--cache", type=int, default=None)
    parser.add_argument("--hf", action="store_true")
    parser.add_argument("--steps", type=int, default=160)
    args = parser.parse_args()
    if args.cache:  # read by oneDNN at its first use: before torch runs anything
        for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
            os.environ[name] = str(args.cache)

    import torch
    import torch.nn.functional as F
    from train_throughput import get_batches, hf_marian, time_training

    from mtkit.core.config import load_config
    from mtkit.core.device import cpu_description, tune_cpu_runtime
    from mtkit.core.vocab import PAD, Vocab
    from mtkit.data.batching import BatchShapes
    from mtkit.model.transformer import build_model
    from mtkit.training.loop import batch_loss

    tune_cpu_runtime()  # as the CLI: glibc settings, and 32-entry caches unless --cache
    cfg = load_config(args.config)
    vocab = len(Vocab.load(cfg.run_path / "spm.model"))
    shapes = (
        BatchShapes(args.multiple, args.group, cfg.model.max_positions)
        if args.shapes == "classes"
        else None
    )
    batches = get_batches(
        cfg, argparse.Namespace(warmup=0, steps=args.steps, synthetic=None), vocab, shapes
    )
    torch.manual_seed(0)
    if args.hf:
        model = hf_marian(cfg.model, vocab, "eager").train()

        def step(batch):
            logits = model(
                input_ids=batch.src, attention_mask=batch.src != PAD, decoder_input_ids=batch.tgt_in
            ).logits
            return F.cross_entropy(
                logits.float().view(-1, logits.size(-1)),
                batch.tgt_out.view(-1),
                ignore_index=PAD,
                label_smoothing=cfg.train.label_smoothing,
            )
    else:
        model = build_model(cfg.model, vocab, vocab).train().use_attention("matmul")

        def step(batch):
            out = batch_loss(model, batch, cfg.train.label_smoothing)
            return out.loss / max(out.tokens, 1)

    # Two passes of train_throughput's timed loop (AdamW, clipping), none untimed.
    timing = argparse.Namespace(warmup=0)
    first, second = (
        time_training(
            step, list(model.parameters()), batches, timing, torch.device("cpu"), torch.bfloat16
        )[0]
        for _ in range(2)
    )
    real = sum(int((b.tgt_out != PAD).sum()) for b in batches)
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "model": "hf_marian_eager" if args.hf else "mtkit",
                "shapes": args.shapes,
                "multiple": args.multiple,
                "group": args.group,
                "cache_entries": args.cache or int(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]),
                "steps": len(batches),
                "distinct_shapes": len({(*b.src.shape, b.tgt_in.size(1)) for b in batches}),
                "real_target_share": round(real / sum(b.tgt_out.numel() for b in batches), 3),
                "pass1_tokens_per_s": round(first),
                "pass2_tokens_per_s": round(second),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        )
    )


if __name__ == "__main__":
    main()

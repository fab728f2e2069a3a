"""Imported Marian models: fine-tuning speed and translation speed beside `transformers`.

    python benchmarks/pretrained.py make DIR         # an OPUS-MT-shaped model, imported
    python benchmarks/pretrained.py train DIR [--steps 8] [--precision auto]
    python benchmarks/pretrained.py translate DIR [--limit 500] [--max-len 60]

`make` builds a random MarianMTModel of OPUS-MT's shape (6 + 6 layers, d_model 512, 8
heads, FFN 2,048, SiLU, shared embeddings) over SentencePiece models trained on the
embedded Multi30k corpus (6,000 pieces a side, one shared id table), saves it in the
Hugging Face layout in DIR/marian (nothing is downloaded: these machines reach no model
hub) and imports it to DIR/imported.pt with `mtkit.interop.marian_import`.

`train` times full training steps (`train_throughput.time_training`, the trainer's own
loss) of the imported model against an mtkit model of the same shape with mtkit's own
options (ReLU, interleaved sinusoids, no output bias), on the same synthetic batches, in
one process, and prints the ratio (the goal: fine-tuning within 10% of mtkit's own).

`translate` times greedy and beam 5 on the first --limit test2016 lines with the same
search on every side (plain log-probability, every output --max-len tokens at most):
mtkit on the checkpoint, its CTranslate2 export (float32, int8) and `transformers`'
`generate` on DIR/marian, each at its best of a few batch sizes, and the share of
outputs identical to mtkit's. Random weights give long outputs (most reach the limit):
the figures are a worst case for all sides alike, not a quality measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # hfmarian: the tests' Marian builder
sys.path.insert(0, str(HERE))

OPUS_MT = dict(
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    max_position_embeddings=512,
    activation_function="swish",
)


def make(folder: Path) -> None:
    import hfmarian
    import sentencepiece as spm
    import transformers

    from mtkit.interop.marian_import import import_marian

    marian = folder / "marian"
    marian.mkdir(parents=True, exist_ok=True)
    pieces = []
    for side, corpus in (("source", "train.en"), ("target", "train.de")):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(hfmarian.lines(corpus, 29000)),
            model_prefix=str(marian / side),
            vocab_size=6000,
            model_type="unigram",
            bos_id=-1,
            eos_id=1,
            unk_id=0,
            pad_id=-1,
            minloglevel=2,
        )
        (marian / f"{side}.model").rename(marian / f"{side}.spm")
        sp = spm.SentencePieceProcessor(model_file=str(marian / f"{side}.spm"))
        pieces += [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i))
        ]
    table = hfmarian.table(pieces)
    (marian / "vocab.json").write_text(json.dumps(table, ensure_ascii=False))
    (marian / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de"})
    )
    pad = len(table) - 1
    torch.manual_seed(0)
    model = transformers.MarianMTModel(
        transformers.MarianConfig(
            vocab_size=len(table),
            **OPUS_MT,
            scale_embedding=True,
            pad_token_id=pad,
            decoder_start_token_id=pad,
            eos_token_id=0,
            forced_eos_token_id=0,
        )
    )
    model.save_pretrained(marian)
    import_marian(marian, folder / "imported.pt")
    print(
        json.dumps(
            {
                "folder": str(folder),
                "vocab": len(table),
                "parameters": sum(p.numel() for p in model.parameters()),
            }
        )
    )


def train_speed(folder: Path, args) -> dict:
    from dataclasses import replace

    from train_throughput import get_batches, time_training

    from mtkit.core.checkpoint import load_checkpoint
    from mtkit.core.config import config_from_dict
    from mtkit.core.device import tune_cpu_runtime
    from mtkit.model.transformer import build_model
    from mtkit.training.loop import batch_loss
    from mtkit.tuning.precision import calibration_shape, resolve_precision

    tune_cpu_runtime()
    payload = load_checkpoint(folder / "imported.pt")
    cfg = config_from_dict(payload["config"])
    cfg = replace(cfg, train=replace(cfg.train, max_tokens=args.max_tokens))
    vocab = payload["model"]["tgt_embed.tokens.weight"].size(0)
    device = torch.device("cpu")
    dtype, _ = resolve_precision(
        args.precision,
        device,
        calibration_shape(args.max_tokens, cfg.model.d_model, cfg.model.ffn_dim),
    )
    batches = get_batches(
        cfg, argparse.Namespace(synthetic=(24, 24), steps=args.steps, warmup=args.warmup), vocab
    )
    own = replace(cfg.model, activation="relu", positions="sinusoidal", output_bias=False)
    rates = {}
    for name, model_cfg in (("imported", cfg.model), ("mtkit_same_shape", own)) * 2:
        model = build_model(model_cfg, vocab, vocab).train()
        if name == "imported":
            model.load_state_dict(payload["model"])

        def step(batch, model=model):
            out = batch_loss(model, batch, cfg.train.label_smoothing)
            return out.loss / max(out.tokens, 1)

        rate, _, _ = time_training(step, list(model.parameters()), batches, args, device, dtype)
        rates.setdefault(name, []).append(rate)
    best = {k: max(v) for k, v in rates.items()}
    return {
        "precision": "bf16" if dtype else "fp32",
        "tokens_per_s": {k: round(v) for k, v in best.items()},
        "imported_vs_mtkit": round(best["imported"] / best["mtkit_same_shape"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["make", "train", "translate"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--max-len", type=int, default=60)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from mtkit.core.device import cpu_description

    if args.what == "make":
        make(args.folder)
        return
    result = {"cpu": cpu_description(), "folder": str(args.folder)}
    if args.what == "train":
        result |= train_speed(args.folder, args)
    else:
        from pretrained_translate import translate_speed

        result |= translate_speed(args.folder, args)
    print(json.dumps(result))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"# {time.perf_counter() - start:.0f} s", file=sys.stderr)

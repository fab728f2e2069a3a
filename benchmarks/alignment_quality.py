"""How well a model's word alignments match an aligner's: test2016's source and reference,
the model forced to read the reference (its cross-attention links, as translation reads
them), against eflomal's links of the same pairs.

    python benchmarks/alignment_quality.py -m runs/multi30k/checkpoints/average.pt \\
        [-m runs/multi30k-guided/checkpoints/average.pt] [--layer L]

No hand-aligned en-de gold set could be had here, so eflomal (pip install eflomal),
trained on the training corpus with test2016 added and symmetrized with grow-diag, stands
in for one: the figures are alignment error rates against eflomal (1 - 2|A∩E| / (|A| +
|E|), every eflomal link counted as sure), with precision and recall. Words are the
whitespace-separated words of each side, as in every mtkit alignment. Prints one JSON
line per model.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def read(name: str) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [x.rstrip("\n") for x in f]


def eflomal_words(sources: list[str], targets: list[str]) -> list[set[tuple[int, int]]]:
    """eflomal's word links, lowercased, symmetrized with grow-diag."""
    from mtkit.data.alignments import align_tokens

    return align_tokens([s.lower() for s in sources], [t.lower() for t in targets])


def model_links(path: str, sources: list[str], targets: list[str], layer: int | None):
    import torch

    from mtkit.engines.loader import load_engine
    from mtkit.search.alignment import align

    engine = load_engine(path, "cpu")
    limit = engine.max_src_tokens
    src = [x[:limit] for x in engine.src_vocab.encode(sources)]
    tgt = [y[: limit - 1] for y in engine.tgt_vocab.encode(targets)]
    out = []
    with torch.inference_mode():
        for start in range(0, len(src), 64):
            s, t = src[start : start + 64], tgt[start : start + 64]
            out += align(
                engine.models,
                s,
                t,
                [[engine.src_vocab.piece(i) for i in x] for x in s],
                [[engine.tgt_vocab.piece(i) for i in y] for y in t],
                layer,
                engine.device,
                guided=bool(engine.config.train.guided_alignment),
            )
    return [set(x) for x in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("--layer", type=int, default=None)
    args = ap.parse_args()
    src, ref = read("test2016.en.gz"), read("test2016.de.gz")
    train_src, train_ref = read("train.en.gz"), read("train.de.gz")
    gold = eflomal_words(train_src + src, train_ref + ref)[len(train_src) :]
    for path in args.model:
        found = model_links(path, src, ref, args.layer)
        both = sum(len(a & e) for a, e in zip(found, gold))
        a_n, e_n = sum(map(len, found)), sum(map(len, gold))
        print(
            json.dumps(
                {
                    "model": path,
                    "aer_vs_eflomal": round(1 - 2 * both / (a_n + e_n), 4),
                    "precision": round(both / a_n, 4),
                    "recall": round(both / e_n, 4),
                    "links": a_n,
                    "eflomal_links": e_n,
                }
            )
        )


if __name__ == "__main__":
    main()

"""Which sentence splitter mtkit uses: each candidate splits test2016 paragraphs (2-5
consecutive sentences joined by a space, in every language of the embedded corpus) and is
scored on the boundaries it recovers, and timed.

    python benchmarks/splitters.py [--paragraphs N]

Prints one row per splitter and language: paragraphs split exactly as they were joined,
boundary precision and recall, and sentences per second (one thread). A sentence that
lacks final punctuation cannot be told from the next one by any splitter; the script
says how many there are.
"""

from __future__ import annotations

import argparse
import gzip
import random
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
LANGUAGES = ("en", "de", "fr", "cs")


def paragraphs(lang: str, seed: int = 1) -> list[list[str]]:
    """test2016 in `lang` as runs of 2-5 consecutive sentences."""
    with gzip.open(DATA / f"test2016.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [x.strip() for x in f]
    rng, out, i = random.Random(seed), [], 0
    while i < len(lines):
        n = rng.randint(2, 5)
        out.append(lines[i : i + n])
        i += n
    return out


def candidates(lang: str) -> dict:
    """name -> a function from a paragraph to its sentences, for what is installed."""
    found = {}
    try:
        import pysbd

        seg = pysbd.Segmenter(language=lang, clean=False)
        found["pysbd"] = lambda text: [s.strip() for s in seg.segment(text)]
    except (ImportError, ValueError):
        pass
    try:
        import blingfire

        found["blingfire"] = lambda text: blingfire.text_to_sentences(text).split("\n")
    except ImportError:
        pass
    try:
        from sentence_splitter import SentenceSplitter

        splitter = SentenceSplitter(language=lang)
        found["sentence-splitter"] = splitter.split
    except (ImportError, Exception):  # noqa: B014 (an unknown language raises its own)
        pass
    return found


def boundaries(sentences: list[str]) -> set[int]:
    """Character offsets (in the sentences joined by spaces) where a sentence starts."""
    out, at = set(), 0
    for s in sentences[:-1]:
        at += len(s) + 1
        out.add(at)
    return out


def found_boundaries(text: str, pieces: list[str]) -> set[int]:
    out, at = set(), 0
    for piece in pieces:
        at = text.find(piece, at)
        if at > 0:
            out.add(at)
        at += len(piece)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paragraphs", type=int, default=0, help="at most this many (0: all)")
    args = ap.parse_args()
    print("splitter | lang | exact paragraphs | boundary P | boundary R | sentences/s")
    for lang in LANGUAGES:
        paras = paragraphs(lang)
        if args.paragraphs:
            paras = paras[: args.paragraphs]
        unmarked = sum(not s.rstrip().endswith((".", "!", "?")) for p in paras for s in p[:-1])
        for name, split in candidates(lang).items():
            exact = tp = fp = fn = 0
            start = time.perf_counter()
            results = [split(" ".join(p)) for p in paras]
            seconds = time.perf_counter() - start
            for p, pieces in zip(paras, results):
                text = " ".join(p)
                gold, got = boundaries(p), found_boundaries(text, pieces)
                exact += gold == got
                tp, fp, fn = tp + len(gold & got), fp + len(got - gold), fn + len(gold - got)
            sentences = sum(map(len, paras))
            print(
                f"{name} | {lang} | {exact}/{len(paras)} | {tp / max(tp + fp, 1):.3f} | "
                f"{tp / max(tp + fn, 1):.3f} | {sentences / seconds:,.0f}"
            )
        print(f"({lang}: {unmarked} inner sentences end without . ! or ?)")


if __name__ == "__main__":
    main()

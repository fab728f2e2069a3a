"""Regenerate the toy copy task: random symbol sequences, target = source.

    python data/copy/make.py      # writes {train,valid,test}.{src,tgt}.gz here

Sequences of 2 to 20 symbols drawn uniformly from 24 letters, from a fixed seed, so the
files are reproducible. 20,000 training pairs, 300 valid, 300 test; the valid and test
sequences do not occur in training.
"""

import gzip
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYMBOLS = "abcdefghijklmnopqrstuvwx"


def main() -> None:
    rng = random.Random(1234)
    seen: set[str] = set()
    for split, n in (("train", 20_000), ("valid", 300), ("test", 300)):
        lines = []
        while len(lines) < n:
            line = " ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(2, 20)))
            if split != "train" and line in seen:
                continue
            seen.add(line)
            lines.append(line)
        for side in ("src", "tgt"):
            with gzip.GzipFile(HERE / f"{split}.{side}.gz", "wb", mtime=0) as f:
                f.write("".join(x + "\n" for x in lines).encode())


if __name__ == "__main__":
    main()

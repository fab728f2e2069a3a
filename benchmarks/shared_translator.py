"""Threads sharing one `mtkit.Translator`: do their html documents come out as one by one?

    python benchmarks/shared_translator.py -m runs/multi30k/checkpoints/best.pt
        [--threads 8] [--documents 40] [--repetitions 100] [--workers 1]

The documents are test2016's first sentences, each a paragraph with every third word in
<b> and the last in <i> (tags that alignments place). Each is translated alone first, one
call at a time (in a thread of its own, as the others run); then, each repetition,
`--threads` threads take the documents from one queue, one call each, all at once. Prints
one JSON line: how many of the documents came out identical (text, and each sentence's
pieces and word links) in each repetition, the calls that failed, and the time of one
by one against the threads'.
"""

from __future__ import annotations

import argparse
import gzip
import json
import queue
import threading
import time
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def page(line: str) -> str:
    words = line.split()
    marked = [f"<b>{w}</b>" if i % 3 == 1 else w for i, w in enumerate(words[:-1])]
    return f"<p>{' '.join(marked + [f'<i>{words[-1]}</i>'])}</p>"


def outcome(t) -> tuple:
    return t.text, [(s.text, s.tokens, s.alignment) for s in t.sentences or (t,)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--documents", type=int, default=40)
    ap.add_argument("--repetitions", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()

    import mtkit

    with gzip.open(DATA / "test2016.en.gz", "rt", encoding="utf-8") as f:
        pages = [page(x.strip()) for x, _ in zip(f, range(args.documents), strict=False)]
    with mtkit.Translator.load(args.model, device="cpu", workers=args.workers) as shared:
        alone: list[tuple] = []

        def one_by_one() -> None:
            alone.extend(outcome(shared.translate([p], format="html")[0]) for p in pages)

        start = time.perf_counter()
        first = threading.Thread(target=one_by_one)
        first.start()
        first.join()
        alone_s = time.perf_counter() - start
        identical, failures = [], Counter()
        threads_s = 0.0
        for _ in range(args.repetitions):
            todo: queue.SimpleQueue = queue.SimpleQueue()
            for i in range(len(pages)):
                todo.put(i)
            got: dict[int, tuple] = {}

            def work(todo: queue.SimpleQueue, got: dict[int, tuple]) -> None:
                while True:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        got[i] = outcome(shared.translate([pages[i]], format="html")[0])
                    except Exception as e:  # noqa: BLE001 - counted, as the figure is
                        failures[f"{type(e).__name__}: {str(e)[:80]}"] += 1

            threads = [threading.Thread(target=work, args=(todo, got)) for _ in range(args.threads)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            threads_s += time.perf_counter() - start
            identical.append(sum(got.get(i) == alone[i] for i in range(len(pages))))
    print(
        json.dumps(
            {
                "threads": args.threads,
                "documents": len(pages),
                "repetitions": args.repetitions,
                "identical": dict(Counter(identical)),
                "all_identical": all(n == len(pages) for n in identical),
                "failures": dict(failures),
                "one_by_one_s": round(alone_s, 2),
                "threads_s_per_repetition": round(threads_s / args.repetitions, 2),
            }
        )
    )


if __name__ == "__main__":
    main()

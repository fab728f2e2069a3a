"""How the time to carry tags through a translation grows with the markup (issue 75): the
markup's own work (`prepare`: read the document, find its runs, take their tags out;
`finish`: put the tags back around the translated words, write the document) for
documents of 2,500 to 20,000 tags in several shapes, with a fake translation (no model).

    python benchmarks/markup_scaling.py [--sizes 2500,5000,10000,20000] [--shapes inline,...]
        [--alignments identity,reversed] [--repeat 3] [--max-seconds 120] [--json]

Shapes, each of N tags (elements or atoms) of HTML:
  inline      one paragraph of N `<b>a</b>` separated by spaces
  numbered    one paragraph of N `<b>` around numbered words (`<b>w17</b>`): every word's
              number is checked after placement (`restore_numbers`)
  nested      one paragraph of N spans in chains nested 100 deep, each level with a word
  attributes  one paragraph of N links of 8 attributes each
  wide-tag    one span of N attributes around a short sentence (N attributes, not tags)
  blocks      N paragraphs, each of three words with one `<b>` inside
  atoms       one paragraph of N atoms between words: `<br>`, `<img>`, a comment, `{x}`

Fake translations: `identity` (each text as it is, word i linked to word i: the output
must be the input again, checked) and `reversed` (the words in reverse order, word i
linked to word n - 1 - i: the output must hold exactly the input's tags, checked).

Prints one row per shape, alignment and size: CPU seconds (this process's, so that
other work on a shared machine adds little) in `prepare` and `finish` and together, the
fastest of --repeat runs; microseconds per tag; and the time as a multiple of the
smallest size's (a time linear in the size gives the ratio of the sizes: 4.0 for 10,000
against 2,500). A run over --max-seconds of CPU time is stopped and shown as such. Run
from the repository root; `PYTHONPATH=DIR` measures the mtkit found in DIR (e.g. another
revision's `git archive`).
"""

from __future__ import annotations

import argparse
import json
import signal
import time

from mtkit.core.translation import Translation
from mtkit.documents.markup import finish, prepare, tags


def inline(n: int) -> str:
    return "<p>" + " ".join(["<b>a</b>"] * n) + "</p>"


def numbered(n: int) -> str:
    return "<p>" + " ".join(f"<b>w{k}</b>" for k in range(n)) + "</p>"


def nested(n: int, depth: int = 100) -> str:
    chains = []
    for c in range(0, n, depth):
        d = min(depth, n - c)
        chains.append("<span>a " * d + "a" + "</span>" * d)
    return "<p>" + " ".join(chains) + "</p>"


def attributes(n: int) -> str:
    links = (
        f'<a href="/x/{k}" title="t{k}" class="c" id="i{k}" data-a="1" data-b="2" '
        f'lang="en" rel="nofollow">a</a>'
        for k in range(n)
    )
    return "<p>" + " ".join(links) + "</p>"


def wide_tag(n: int) -> str:
    attrs = " ".join(f'data-a{k}="{k}"' for k in range(n))
    return f"<p>A man <span {attrs}>rides a</span> bike.</p>"


def blocks(n: int) -> str:
    return "\n".join(["<p>a <b>a</b> a.</p>"] * n)


def atoms(n: int) -> str:
    kinds = ["<br>", '<img src="x.png">', "<!-- c -->", "{x}"]
    return "<p>" + "".join(f"a{kinds[k % 4]}" + (" " if k % 3 else "") for k in range(n)) + "</p>"


def entities(n: int) -> str:
    return "<p>" + "a &amp; " * n + "</p>"


SHAPES = {
    "inline": inline,
    "numbered": numbered,
    "nested": nested,
    "attributes": attributes,
    "wide-tag": wide_tag,
    "blocks": blocks,
    "atoms": atoms,
    "entities": entities,
}


def identity(texts: list[str]) -> list[Translation]:
    return [
        Translation(t, t, -1.0, -0.5, (), tuple((i, i) for i in range(len(t.split()))))
        for t in texts
    ]


def reversed_words(texts: list[str]) -> list[Translation]:
    out = []
    for text in texts:
        words = text.split()
        n = len(words)
        links = tuple((i, n - 1 - i) for i in range(n))
        out.append(Translation(text, " ".join(reversed(words)), -1.0, -0.5, (), links))
    return out


ALIGNMENTS = {"identity": identity, "reversed": reversed_words}


class TooLong(Exception):
    pass


def _stop(signum, frame):
    raise TooLong


def measure(document: str, translate, max_seconds: float) -> tuple[float, float, str]:
    """CPU seconds in prepare and in finish, and the output; TooLong past `max_seconds`
    of CPU time."""
    signal.signal(signal.SIGVTALRM, _stop)
    signal.setitimer(signal.ITIMER_VIRTUAL, max_seconds)
    try:
        start = time.process_time()
        prepared = prepare(document, "html")
        prepared_at = time.process_time()
        translated = translate(prepared.texts)
        finish_at = time.process_time()
        out = finish(prepared, translated)
        end = time.process_time()
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    return prepared_at - start, end - finish_at, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2500,5000,10000,20000")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--alignments", default=",".join(ALIGNMENTS))
    ap.add_argument("--repeat", type=int, default=3, help="runs per case, the fastest kept")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="per run")
    ap.add_argument("--json", action="store_true", help="also one JSON line per case")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    header = f"{'shape':<11} {'alignment':<9} {'tags':>6} {'chars':>9} {'prepare s':>9} "
    header += f"{'finish s':>9} {'total s':>9} {'us/tag':>7} {'ratio':>6}"
    print(header)
    summary = []
    for shape in args.shapes.split(","):
        for name in args.alignments.split(","):
            first = None
            stopped = False
            for n in sizes:
                document = SHAPES[shape](n)
                row = f"{shape:<11} {name:<9} {n:>6} {len(document):>9} "
                if stopped:
                    print(row + f"(not run: a smaller size took over {args.max_seconds:g} s)")
                    continue
                try:
                    runs = [
                        measure(document, ALIGNMENTS[name], args.max_seconds)
                        for _ in range(args.repeat)
                    ]
                except TooLong:
                    print(row + f"(stopped after {args.max_seconds:g} s)")
                    stopped = True
                    continue
                prep, fin, out = min(runs, key=lambda r: r[0] + r[1])
                ok = out == document if name == "identity" else tags(out) == tags(document)
                assert ok, f"{shape} {name} {n}: the output lost or changed its tags"
                total = prep + fin
                first = first or (n, total)
                ratio = total / first[1]
                print(
                    row + f"{prep:>9.3f} {fin:>9.3f} {total:>9.3f} "
                    f"{total / n * 1e6:>7.1f} {ratio:>6.2f}",
                    flush=True,
                )
                if n != first[0]:
                    summary.append((shape, name, first[0], n, ratio))
                if args.json:
                    record = {"shape": shape, "alignment": name, "tags": n, "chars": len(document)}
                    record |= {"prepare_s": prep, "finish_s": fin, "total_s": total}
                    print(json.dumps(record))
    print("\ntime at N over time at the smallest size (linear: N / smallest)")
    for shape, name, small, n, ratio in summary:
        print(f"  {shape:<11} {name:<9} {n:>6} / {small:<6} {ratio:6.2f}  (linear {n / small:.1f})")


if __name__ == "__main__":
    main()

"""Localisation segments through a trained model: test2016 sentences tagged as DITA
segments are (issue 77's goal), translated as XML fragments and as HTML.

    python benchmarks/xml_segments.py -m runs/multi30k/checkpoints/average.pt [--n 300]

Each of the first --n test2016 sources becomes a segment with no root: 1-3 runs of 1-3
words (never overlapping) wrapped in DITA's `ph`, `uicontrol`, `parmname` or `codeph`
(seeded), `&`, `<`, `>` escaped. Each segment is translated with format="xml" and with
format="html", in fp32, and judged:

- accepted: translated without an error;
- well-formed with exactly its tags: the output is a well-formed fragment (lxml, inside
  an implied element) whose tags are the segment's, each as written;
- same words: the output with its tags taken out (its text, entities read) is, space for
  space, the plain translation of what the model read of the segment: its text without
  tags, less what is kept untranslated (in XML DITA's `codeph` is code: kept, an atom
  in its sentence; in HTML it is an unknown element, inline and translated). A tag must
  not change the words.

Prints one table (and, with --json, one JSON object) with the CPU's model name.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import random
import re
import subprocess
import time
from pathlib import Path

from lxml import etree

import mtkit
from mtkit.documents.markup import tags

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
NAMES = ("ph", "uicontrol", "parmname", "codeph")
KEPT = {"xml": ("codeph",), "html": ()}  # what each format keeps untranslated


def read(name: str, n: int) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [x.rstrip("\n") for _, x in zip(range(n), f)]


def segment(sentence: str, rng: random.Random) -> str:
    """`sentence` as a DITA segment: 1-3 runs of 1-3 words in ph, uicontrol, parmname or
    codeph, never overlapping, no root."""
    words = sentence.split()
    free, spans = set(range(len(words))), []
    for _ in range(rng.randint(1, 3)):
        length = rng.randint(1, 3)
        starts = [
            i
            for i in range(len(words) - length + 1)
            if all(j in free for j in range(i, i + length))
        ]
        if not starts:
            break
        i = rng.choice(starts)
        free -= set(range(i, i + length))
        spans.append((i, i + length - 1, rng.choice(NAMES)))
    out = []
    for k, word in enumerate(words):
        word = html.escape(word, quote=False)
        for first, last, name in spans:
            if first == k:
                word = f"<{name}>" + word
            if last == k:
                word += f"</{name}>"
        out.append(word)
    return " ".join(out)


def fragment(text: str):
    """`text` read as the content of an element (lxml), or None where it is not XML."""
    try:
        return etree.fromstring(f"<r>{text}</r>".encode())
    except etree.XMLSyntaxError:
        return None


def words_read(segment_text: str, kept: tuple[str, ...]) -> str:
    """The words the model reads of a segment: its text, less the kept elements'."""
    root = fragment(segment_text)
    for name in kept:
        for e in root.iter(name):
            e.text = ""
    return " ".join("".join(root.itertext()).split())


def words_of(output: str, kept: tuple[str, ...]) -> str | None:
    """The words of an output with its tags (and kept elements' content) taken out."""
    root = fragment(output)
    if root is None:
        return None
    return words_read(output, kept)


def judge(translator, segments: list[str], format: str, beam: int | None) -> dict:
    options = dict(beam=beam) if beam else {}
    plain_in = [words_read(s, KEPT[format]) for s in segments]
    plain = [" ".join(t.text.split()) for t in translator.translate(plain_in, **options)]
    start = time.perf_counter()  # (after the plain texts: the model warm, its helpers up)
    try:
        outputs = [t.text for t in translator.translate(segments, format=format, **options)]
    except mtkit.Error:  # one at a time: which ones are refused
        outputs = []
        for s in segments:
            try:
                outputs.append(translator.translate([s], format=format, **options)[0].text)
            except mtkit.Error:
                outputs.append(None)
    seconds = time.perf_counter() - start
    accepted = [o is not None for o in outputs]
    exact = [
        o is not None and fragment(o) is not None and tags(o, "xml") == tags(s, "xml")
        for s, o in zip(segments, outputs)
    ]
    same = [o is not None and words_of(o, KEPT[format]) == p for o, p in zip(outputs, plain)]
    n = len(segments)
    return {
        "segments": n,
        "accepted %": round(100 * sum(accepted) / n, 2),
        "well-formed, exactly its tags %": round(100 * sum(exact) / n, 2),
        "same words as the plain translation %": round(100 * sum(same) / n, 2),
        "segments/s": round(n / seconds, 1),
        "examples of other words": [
            {"segment": s, "output": o, "plain": p}
            for s, o, p, ok in zip(segments, outputs, plain, same)
            if not ok
        ][:3],
    }


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    found = re.search(r"Model name:\s*(.+)", out)
    return found.group(1).strip() if found else "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--n", type=int, default=300, help="test2016 sentences made segments")
    ap.add_argument("--beam", type=int, default=None, help="default: the checkpoint's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    segments = [segment(s, rng) for s in read("test2016.en.gz", args.n)]
    report = {"cpu": cpu_name(), "model": args.model, "precision": "fp32"}
    with mtkit.Translator.load(args.model, device="cpu", precision="fp32") as translator:
        for format in ("xml", "html"):
            report[format] = judge(translator, segments, format, args.beam)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
        return
    print(f"{report['cpu']}, {report['model']}, fp32, {len(segments)} segments")
    for format in ("xml", "html"):
        print(f"\nformat={format}")
        for key, value in report[format].items():
            if key != "examples of other words":
                print(f"  {key:40} {value}")
        for example in report[format]["examples of other words"]:
            print(f"  e.g. {example['segment']}\n    -> {example['output']}")
            print(f"    plain: {example['plain']}")


if __name__ == "__main__":
    main()

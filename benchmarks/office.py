"""A long Word document translated as `mtkit translate -i FILE.docx` translates it, against
a short one and against the same paragraphs as plain text (issue 78's goal: memory
bounded, throughput within 15% of plain text).

    python benchmarks/office.py [-m CKPT] [--pages 200 20] [--per-page 8] [--rounds 1] [--json]

Each document is generated with python-docx (seeded): `--per-page` paragraphs a page of
two sentences of test2016 words each, a bold run and an italic run in every paragraph, a
heading every page, a page break after each. Each measurement runs in a process of its
own, so that its peak RSS is its own: the model loaded (`mtkit.Translator`) and warmed
up on two sentences, then the file's bytes translated (`Translator.translate_document`),
or the same paragraphs as plain text (`Translator.translate`, one text a paragraph,
split into sentences as the document's are). With `-m` that model translates; without it
a fake translation (each word in capitals, word i linked to word i) stands in for the
model, which measures the documents layer alone. With `--rounds N` each size is
measured N times, the document and the text in turn, and each side's best time is kept
(a shared machine's noise only slows a run down). Prints one row per size and kind
(paragraphs, best seconds, paragraphs/s, peak RSS, RSS after loading) and the document's
throughput as a share of plain text's."""

from __future__ import annotations

import argparse
import io
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "a man in an orange hat starring at something two young guys with shaggy hair look at "
    "their hands while hanging out in the yard a little girl climbing into a wooden "
    "playhouse a dog runs through the green grass near the lake with a ball"
).split()


def sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(6, 14))
    return " ".join(words).capitalize() + "."


def generated(pages: int, per_page: int, seed: int = 1) -> tuple[bytes, list[str]]:
    """A docx of `pages` pages, and its paragraphs' texts (headings included)."""
    import docx
    from docx.enum.text import WD_BREAK

    rng = random.Random(seed)
    document = docx.Document()
    texts = []
    for page in range(pages):
        heading = f"Part {page + 1}: {sentence(rng)}"
        document.add_heading(heading, level=2)
        texts.append(heading)
        for _ in range(per_page):
            first, second = sentence(rng), sentence(rng)
            words = second.split()
            at = rng.randrange(1, len(words) - 2)
            p = document.add_paragraph(first + " " + " ".join(words[:at]) + " ")
            p.add_run(words[at]).bold = True
            p.add_run(" " + words[at + 1] + " ")
            p.add_run(words[at + 2]).italic = True
            p.add_run(" " + " ".join(words[at + 3 :]))
            texts.append(p.text)
        document.paragraphs[-1].runs[-1].add_break(WD_BREAK.PAGE)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue(), texts


def fake(texts: list[str]):
    from mtkit.core.translation import Translation

    return [
        Translation(t, t.upper(), -1.0, -0.5, (), tuple((k, k) for k in range(len(t.split()))))
        for t in texts
    ]


def child(kind: str, path: str, model: str | None) -> None:
    """One measurement, in this process: prints a JSON object."""
    import mtkit
    from mtkit.documents.formats import translate_files

    translator = mtkit.Translator.load(model, device="cpu") if model else None
    if translator is not None:  # (warmed up: the first call measures the precision)
        translator.translate(["A man in an orange hat.", "Two dogs play in the grass."])
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = Path(path).read_bytes()
    texts = json.loads(Path(path + ".json").read_text())
    start = time.perf_counter()
    if kind == "docx":
        if translator is not None:
            translator.translate_document(data, "docx")
        else:
            translate_files([data], "docx", fake)
    elif translator is not None:
        translator.translate(texts)
    else:
        fake(texts)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "loaded_mb": loaded / 1024}))


def measured(kind: str, path: Path, model: str | None) -> dict:
    argv = [sys.executable, __file__, "--child", kind, str(path)]
    if model:
        argv += ["-m", model]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", help="a checkpoint (default: a fake translation)")
    parser.add_argument("--pages", type=int, nargs="+", default=[200, 20])
    parser.add_argument("--per-page", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each, the best kept")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.model)
        return
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for pages in args.pages:
            data, texts = generated(pages, args.per_page)
            path = Path(folder) / f"doc{pages}.docx"
            path.write_bytes(data)
            Path(str(path) + ".json").write_text(json.dumps(texts))
            runs: dict[str, list[dict]] = {"docx": [], "text": []}
            for _ in range(args.rounds):
                for kind in runs:
                    runs[kind].append(measured(kind, path, args.model))
            for kind, found in runs.items():
                rows.append(
                    {
                        "pages": pages,
                        "kind": kind,
                        "paragraphs": len(texts),
                        "bytes": len(data),
                        "seconds": min(r["seconds"] for r in found),
                        "all_seconds": [r["seconds"] for r in found],
                        "peak_mb": max(r["peak_mb"] for r in found),
                        "loaded_mb": max(r["loaded_mb"] for r in found),
                    }
                )
    print(
        f"{'pages':>5} {'as':>5} {'paragraphs':>10} {'seconds':>8} {'para/s':>8} "
        f"{'peak MB':>8} {'loaded MB':>9}"
    )
    for r in rows:
        r["per_second"] = r["paragraphs"] / r["seconds"]
        print(
            f"{r['pages']:>5} {r['kind']:>5} {r['paragraphs']:>10} {r['seconds']:>8.2f} "
            f"{r['per_second']:>8.1f} {r['peak_mb']:>8.0f} {r['loaded_mb']:>9.0f}"
        )
    for pages in args.pages:
        docx, text = (
            next(r for r in rows if r["pages"] == pages and r["kind"] == k)
            for k in ("docx", "text")
        )
        share = docx["per_second"] / text["per_second"]
        print(f"{pages} pages: docx throughput {share:.0%} of plain text's")
    if args.json:
        print(json.dumps({"model": args.model or "fake (capitals)", "rows": rows}))


if __name__ == "__main__":
    main()

"""Real text through a trained model: paragraphs and HTML, against plain line-by-line
translation of the same sentences (issue "Translate real text").

    python benchmarks/documents.py -m runs/multi30k/checkpoints/average.pt [--beam 5]

Paragraphs: test2016 joined into lines of 2-5 consecutive sentences (seeded), translated
whole (--no-split, what mtkit did before) and split into sentences (the default), beside
the sentences one per line; every side is scored on the same paragraphs (its outputs
joined as the references are), and timed in sentences per second, one process, the
model loaded once (`mtkit.Translator`).

HTML: each test2016 source with 1-3 inline tags (b, i, a href) around random runs of
1-2 words, translated with --format html: the share of outputs that are well-formed
with exactly their input's tags, the BLEU of the outputs with tags stripped beside the
plain translation's, and where the tags land: a tag is right when it holds exactly the
output words that an aligner outside mtkit (eflomal, where installed: pip install
eflomal) links to its source words in the (source, output) pair, trained on these pairs and
10,000 training sentences with their greedy translations. Two judgements: exactly the
span of the links both of eflomal's directions agree on, and (looser, as eflomal misses
links such as an article's) at least one word either direction links and no word farther
than one from them. Tags whose source words eflomal links to nothing are left out, and
counted.

Prints one table per part and, with --json, one JSON object of every figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import time
from pathlib import Path

import mtkit
from mtkit.documents.markup import parse, tags

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
TAG = re.compile(r"<[^>]+>")


def read(name: str) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [x.rstrip("\n") for x in f]


def paragraphs(n: int, seed: int = 1) -> list[list[int]]:
    """Runs of 2-5 consecutive line numbers covering 0..n-1."""
    rng, out, i = random.Random(seed), [], 0
    while i < n:
        k = rng.randint(2, 5)
        out.append(list(range(i, min(i + k, n))))
        i += k
    return out


def timed(call):
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def paragraph_part(translator, src, ref, beam):
    groups = paragraphs(len(src))
    joined_src = [" ".join(src[i] for i in g) for g in groups]
    joined_ref = [" ".join(ref[i] for i in g) for g in groups]
    translator.translate(src[:50], beam=beam)  # warm up
    rows = {}
    lines, t_lines = timed(lambda: translator.translate(src, beam=beam, split=False))
    by_line = [" ".join(lines[i].text for i in g if lines[i].text) for g in groups]
    rows["sentences, one per line"] = (by_line, t_lines)
    split, t_split = timed(lambda: translator.translate(joined_src, beam=beam, split=True))
    rows["paragraphs, split (default)"] = ([t.text for t in split], t_split)
    whole, t_whole = timed(lambda: translator.translate(joined_src, beam=beam, split=False))
    rows["paragraphs, whole (--no-split)"] = ([t.text for t in whole], t_whole)
    out = {}
    for name, (hyps, seconds) in rows.items():
        bleu = mtkit.score(hyps, joined_ref, ["bleu"]).bleu
        out[name] = {"bleu": round(bleu, 2), "sentences_per_s": round(len(src) / seconds, 1)}
    exact = [k for k, (t, g) in enumerate(zip(split, groups)) if len(t.sentences or [t]) == len(g)]
    out["paragraphs split into exactly their sentences"] = f"{len(exact)}/{len(groups)}"
    for name in ("sentences, one per line", "paragraphs, split (default)"):
        hyps = [rows[name][0][k] for k in exact]
        bleu = mtkit.score(hyps, [joined_ref[k] for k in exact], ["bleu"]).bleu
        out[f"{name}: BLEU on the paragraphs split exactly"] = round(bleu, 2)
    return out


def tagged(sentence: str, rng: random.Random) -> tuple[str, list[tuple[str, list[int]]]]:
    """`sentence` with 1-3 inline tags around runs of 1-2 words (never overlapping), and
    each tag's name and source word indices."""
    words = sentence.split()
    free, marks = set(range(len(words))), []
    for _ in range(rng.randint(1, 3)):
        length = rng.randint(1, 2)
        starts = [
            i
            for i in range(len(words) - length + 1)
            if all(j in free for j in range(i, i + length))
        ]
        if not starts:
            break
        i = rng.choice(starts)
        span = list(range(i, i + length))
        free -= set(span)
        marks.append((rng.choice(["b", "i", "a"]), span))
    out = []
    for k, word in enumerate(words):
        word = re.sub(r"[<>&]", "", word)  # the sentence itself holds no markup
        for m, (name, span) in enumerate(marks):
            extra = ' href="/x"' if name == "a" else ""
            if span[0] == k:
                word = f'<{name}{extra} data-k="{m}">' + word
            if span[-1] == k:
                word += f"</{name}>"
        out.append(word)
    return " ".join(out), marks


def eflomal_links(sources: list[str], targets: list[str]):
    """For each (source, target) pair, the links both of eflomal's directions agree on
    and those either finds (lowercased words); None where eflomal is not installed."""
    try:
        import eflomal  # noqa: F401
    except ImportError:
        return None
    import tempfile

    from eflomal import Aligner

    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        Aligner().align(
            [s.lower() for s in sources],
            [t.lower() for t in targets],
            links_filename_fwd=str(fwd),
            links_filename_rev=str(rev),
            quiet=True,
        )
        pairs = zip(fwd.read_text().splitlines(), rev.read_text().splitlines())
        return [(_links(f) & _links(r), _links(f) | _links(r)) for f, r in pairs]


def _links(line: str) -> set[tuple[int, int]]:
    return {tuple(map(int, x.split("-"))) for x in line.split()}


def html_part(translator, src, ref, beam, train_src, train_out, align_layer=None):
    rng = random.Random(2)
    inputs = [tagged(s, rng) for s in src]
    plain, plain_seconds = timed(lambda: translator.translate(src, beam=beam))
    done, seconds = timed(
        lambda: translator.translate(
            [h for h, _ in inputs], beam=beam, format="html", align_layer=align_layer
        )
    )
    well_formed = 0
    stripped = []
    for (html_in, _), t in zip(inputs, done):
        try:
            parse(t.text, "xml")
            well_formed += tags(t.text) == tags(html_in)
        except mtkit.Error:
            pass
        stripped.append(" ".join(TAG.sub("", t.text).split()))
    bleu_plain = mtkit.score([t.text for t in plain], ref, ["bleu"]).bleu
    bleu_html = mtkit.score(stripped, ref, ["bleu"]).bleu
    out = {
        "well-formed with the input's tags": f"{well_formed}/{len(src)}",
        "BLEU, plain translation": round(bleu_plain, 2),
        "BLEU, html with tags stripped": round(bleu_html, 2),
        "sentences_per_s (html)": round(len(src) / seconds, 1),
        "sentences_per_s (plain, without alignments)": round(len(src) / plain_seconds, 1),
    }
    # where the tags land, judged by eflomal's links of (source, output), trained on
    # these pairs and the training source with its own translations for more data
    links = eflomal_links(train_src + src, train_out + stripped)
    if links is None:
        out["tag placement"] = "eflomal not installed (pip install eflomal)"
        return out
    links = links[len(train_src) :]
    exact = near = judged = unlinked = 0
    for (_, marks), t, (both, either) in zip(inputs, done, links):
        inside = _tag_words(t.text)  # each tag's output words, read from the output
        for k, (_, span) in enumerate(marks):
            sure = sorted({j for i, j in both if i in span})
            found = sorted({j for i, j in either if i in span})
            if not found:
                unlinked += 1
                continue
            judged += 1
            got = inside.get(k, [])
            exact += bool(sure) and got == list(range(sure[0], sure[-1] + 1))
            near += bool(set(got) & set(found)) and all(
                found[0] - 1 <= w <= found[-1] + 1 for w in got
            )
    out["tags exactly on the words both eflomal directions link"] = _share(exact, judged)
    out["tags on words either direction links, at most one word beyond"] = _share(near, judged)
    out["tags left out (eflomal links their words to nothing)"] = unlinked
    return out


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / max(whole, 1):.1f}%)"


def _tag_words(text: str) -> dict[int, list[int]]:
    """For each inline tag of a translated sentence (by its data-k), the indices of the
    output words inside it, counted as in the output with its tags stripped (a tag does
    not break a word: "<b>Hund</b>." is one word)."""
    word, in_word, opened, spans = -1, False, [], {}
    for tok in re.findall(r"<[^>]+>|\s+|[^\s<]+", text):
        if tok.startswith("</"):
            spans[opened.pop()][1] = word
        elif tok.startswith("<"):
            k = int(re.search(r'data-k="(\d+)"', tok).group(1))
            opened.append(k)
            spans[k] = [word if in_word else word + 1, word]
        elif tok.isspace():
            in_word = False
        elif not in_word:
            word, in_word = word + 1, True
    return {k: list(range(a, b + 1)) for k, (a, b) in spans.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--parts", default="paragraphs,html")
    ap.add_argument("--align-layer", type=int, default=None, help="decoder layer the tags follow")
    args = ap.parse_args()
    src, ref = read("test2016.en.gz"), read("test2016.de.gz")
    report = {}
    with mtkit.Translator.load(args.model) as translator:
        if "paragraphs" in args.parts:
            report["paragraphs"] = paragraph_part(translator, src, ref, args.beam)
        if "html" in args.parts:
            train_src = read("train.en.gz")[:10000]
            train_out = [t.text for t in translator.translate(train_src, beam=1)]
            report["html"] = html_part(
                translator, src, ref, args.beam, train_src, train_out, args.align_layer
            )
    if args.json:
        print(json.dumps(report))
        return
    for part, figures in report.items():
        print(f"## {part}")
        for name, value in figures.items():
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()

"""Terminology constraints' benchmark, run by `translate_speed.py --constraints`.

    python benchmarks/translate_speed.py -m runs/multi30k/checkpoints/average.pt \\
        --constraints --limit 500 [--constraint-beams 5,10] [--rounds 3]

It translates the whole source file (test2016) with beam 5, then keeps the first
`--limit` lines (500) whose reference holds `--per-line` phrases (2) of 1 to 3 words that
are not in that unconstrained output (whole words, `mtkit.core.terms.occurs`) and do not
overlap each other, chosen with a fixed seed. It then times, on those lines, in interleaved rounds
(medians): plain beam 5; beam 5 given an empty constraint list for every line (the cost
of the feature when unused); and the constrained search at each of `--constraint-beams`.
It reports sentences/s, each one's time relative to plain beam 5, BLEU against the
references, the share of required phrases that appear (`mtkit.core.terms.term_accuracy`, as
whole words) and of lines whose output met all of them in the search (`met`), and the
CPU it ran on.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace

from mtkit.core.scoring import score
from mtkit.core.search_options import SearchOptions
from mtkit.core.terms import occurs, term_accuracy
from mtkit.engines.pytorch import TorchEngine

WORD_EDGE = ".,;:!?\"'()[]"


def reference_phrases(
    reference: str, output: str, count: int, rng: random.Random
) -> list[tuple[str]]:
    """Up to `count` phrases of 1-3 words of `reference`, none in `output`, not
    overlapping, as one-alternative constraints."""
    words = reference.split()
    spans = [(i, n) for n in (1, 2, 3) for i in range(len(words) - n + 1)]
    rng.shuffle(spans)
    taken: set[int] = set()
    out = []
    for i, n in spans:
        phrase = " ".join(words[i : i + n]).strip(WORD_EDGE)
        if len(out) == count:
            break
        if (
            not phrase
            or not any(c.isalnum() for c in phrase)
            or taken & set(range(i, i + n))
            or occurs(phrase, output)
            or not occurs(phrase, reference)
        ):
            continue
        taken |= set(range(i, i + n))
        out.append((phrase,))
    return out


def timed(
    translator: TorchEngine, lines: list[str], opts: SearchOptions, constraints: list | None
) -> tuple[list, float]:
    start = time.perf_counter()
    hyps = translator.translate(
        lines, opts, batch_tokens=translator.config.decode.batch_tokens, constraints=constraints
    )
    return hyps, time.perf_counter() - start


def compare_constraints(
    translator: TorchEngine, args, sources: list[str], all_references: list[str]
) -> dict:
    base = SearchOptions.from_config(translator.config.decode, beam=5)
    plain, _ = timed(translator, sources, base, None)  # also warms up
    texts = [translator.tgt_vocab.decode(h[0].tokens) for h in plain]
    rng = random.Random(1)
    chosen = [
        (s, r, w)
        for s, r, o in zip(sources, all_references, texts, strict=True)
        if len(w := reference_phrases(r, o, args.per_line, rng)) == args.per_line
    ]
    lines, references, wanted = (list(x) for x in zip(*chosen[: args.limit], strict=True))
    beams = [int(b) for b in args.constraint_beams.split(",")]
    runs = {"beam5": (base, None), "beam5_no_constraints_given": (base, [[] for _ in lines])}
    runs |= {f"constrained_beam{b}": (replace(base, beam=b), wanted) for b in beams}
    times: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[str]] = {}
    met: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (opts, cons) in runs.items():
            hyps, elapsed = timed(translator, lines, opts, cons)
            times[name].append(elapsed)
            outputs[name] = [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]
            met[name] = sum(h[0].met is not False for h in hyps) / len(hyps)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "lines": len(lines),
        "of_lines": len(sources),
        "constraints": sum(map(len, wanted)),
        "beam_default": translator.config.decode.beam,
    }
    for name in runs:
        bleu = score(outputs[name], references, ["bleu"])[0].score
        terms = term_accuracy(outputs[name], wanted)
        result[name] = {
            "sentences_per_s": round(len(lines) / median[name], 1),
            "time_vs_beam5": round(median[name] / median["beam5"], 3),
            "bleu": round(bleu, 2),
            "term_accuracy": round(terms.accuracy, 4),
            **({"lines_met": round(met[name], 4)} if runs[name][1] else {}),
        }
    return result

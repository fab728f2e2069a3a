"""What a translation is, as every surface returns it: the Python API (`mtkit.Translator`),
`translate --format jsonl`, the HTTP routes, and the documents layer (`mtkit.documents`),
which puts a document's tags back around the target words its alignment names.

A `Translation` is text, not ids: the output's subword pieces, its scores, and its word
alignment, where a word is a whitespace-separated word of `source` and of `text` (what
SentencePiece's "▁" marks), so a caller needs no vocabulary to use the links. A line
translated sentence by sentence (`mtkit.documents.sentences`) is one `Translation` whose
`sentences` are the parts, and whose links count words over the whole line. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mtkit.core.hypothesis import Hypothesis
from mtkit.core.vocab import Vocab

Links = tuple[tuple[int, int], ...]  # (source word, target word)


class Anchored(str):
    """A text to translate whose word links are wanted only around its `anchors`: the
    character spans (start, end) whose words a document places something by (its tags,
    its numbers: `mtkit.documents.markup`). A sentence of it that no anchor touches skips
    the links' pass (`mtkit.engines.session.translate_requests` tells the engine's
    `translate` which lines want `links`), and its part of the line's links is empty; a
    plain str wants links for every word."""

    anchors: tuple[tuple[int, int], ...]

    def __new__(cls, text: str, anchors: Sequence[tuple[int, int]]) -> Anchored:
        made = super().__new__(cls, text)
        made.anchors = tuple(anchors)
        return made

    def touched(self, lo: int, hi: int) -> bool:
        """Whether an anchor touches characters lo..hi (both ends included)."""
        return any(start <= hi and end >= lo for start, end in self.anchors)


@dataclass(frozen=True)
class Translation:
    """One translation of one input.

    `score` is what the search ranked it by (log-probability over the GNMT length
    penalty); `confidence` is the mean log-probability per output token, end of sentence
    included (0 is certain; lower is less sure), comparable across sentences of any
    length: what a user or a pipeline filters on. `tokens` are the output's subword
    pieces. `alignment` links (source word, target word), None where not asked for.
    `constraints_met`: None where none were asked for, else whether it holds them all.
    `sentences`: the parts of a line translated sentence by sentence (empty otherwise).
    `alternatives`: the next best translations, best first, where more than one was asked
    for (n-best)."""

    source: str
    text: str
    score: float
    confidence: float
    tokens: tuple[str, ...] = ()
    alignment: Links | None = None
    constraints_met: bool | None = None
    sentences: tuple[Translation, ...] = ()
    alternatives: tuple[Translation, ...] = ()

    @classmethod
    def of(cls, source: str, hyp: Hypothesis, vocab: Vocab) -> Translation:
        """A search's hypothesis of `source`, as text (ids decoded with `vocab`)."""
        return cls(
            source=source,
            text=vocab.decode(hyp.tokens),
            score=hyp.score,
            confidence=confidence(hyp),
            tokens=tuple(vocab.piece(i) for i in hyp.tokens),
            alignment=hyp.alignment,
            constraints_met=hyp.met,
        )


def confidence(hyp: Hypothesis) -> float:
    """Mean log-probability per output token, end of sentence included (an empty source's
    empty output, which no search scored, is 0)."""
    return hyp.log_prob / (len(hyp.tokens) + 1) if hyp.log_prob else 0.0


def joined(source: str, parts: Sequence[Translation], separator: str = " ") -> Translation:
    """The translation of `source` whose sentences were translated one by one (`parts`,
    in order): their texts joined by `separator`, their tokens in a row, their links moved
    to count words over the whole line (a part searched without links, `Anchored`, adds
    none; the line has none where no part has them), their scores and confidences weighted by the
    tokens each scored (eos included), and constraints met where every part met its own."""
    if len(parts) == 1:
        return parts[0]
    src_at = tgt_at = 0
    links: list[tuple[int, int]] = []
    aligned = any(p.alignment is not None for p in parts)
    for p in parts:
        if aligned:
            links.extend((s + src_at, t + tgt_at) for s, t in p.alignment or ())
        src_at += len(p.source.split())
        tgt_at += len(p.text.split())
    met = [p.constraints_met for p in parts if p.constraints_met is not None]
    score, confidence = weighted(parts)
    return Translation(
        source=source,
        text=separator.join(p.text for p in parts if p.text),
        score=score,
        confidence=confidence,
        tokens=tuple(t for p in parts for t in p.tokens),
        alignment=tuple(links) if aligned else None,
        constraints_met=all(met) if met else None,
        sentences=tuple(parts),
    )


def weighted(parts: Sequence[Translation]) -> tuple[float, float]:
    """The score and the confidence of a translation made of `parts` (a line's sentences,
    a document's texts): theirs, each part weighted by the tokens it scored, eos included
    (0 and 0 for no parts)."""
    weights = [len(p.tokens) + 1 for p in parts]
    total = sum(weights) or 1
    return (
        sum(p.score * w for p, w in zip(parts, weights, strict=True)) / total,
        sum(p.confidence * w for p, w in zip(parts, weights, strict=True)) / total,
    )

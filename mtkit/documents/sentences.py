"""A line of several sentences, translated sentence by sentence and joined back.

The models mtkit trains, like most published ones, learned from single sentences: given
a paragraph on one line they translate it as one long sentence and drop much of it. So a
line is split into sentences, each is translated (in one batch with the rest), and the
translations are joined on one line again (`mtkit.core.translation.joined`).

The splitter is sentence-splitter's (the Moses rules with each language's
non-breaking prefixes: "Dr.", "z.B.", "p. ex." end no sentence). It was chosen by
`benchmarks/splitters.py` over pysbd and blingfire: on test2016 paragraphs in en, de, fr
and cs it recovers as many boundaries as the best of them, covers Czech, and is fast
next to a translation. A language it has no prefixes for is split with English's.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# Scripts written without spaces between words: their sentences are joined with nothing.
UNSPACED = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})


@functools.lru_cache(maxsize=16)
def _splitter(lang: str):
    from sentence_splitter import SentenceSplitter, SentenceSplitterException

    try:
        return SentenceSplitter(language=lang)
    except SentenceSplitterException:
        log.info("no sentence-splitting rules for %r: English's are used", lang)
        return SentenceSplitter(language="en")


def sentence_spans(text: str, lang: str = "en") -> list[tuple[int, int]]:
    """Where each sentence of `text` is: (start, end) character offsets, in order, with
    nothing but whitespace between and around them. Text of one sentence (or none) is one
    span (or none); whatever the splitter returns that is not text of the line, exactly,
    leaves the line whole.

    Whitespace is not the splitter's to judge: it sees the text with each run of
    whitespace (a double space, a line break of hard-wrapped markup) as one space, as the
    model does, and its sentences are found again in `text` by their other characters."""
    stripped = text.strip()
    if not stripped:
        return []
    start = text.index(stripped[0])
    whole = [(start, start + len(stripped))]
    if not any(c in stripped for c in ".!?…"):  # nothing can end a sentence inside
        return whole
    inked = [i for i, c in enumerate(text) if not c.isspace()]  # offsets of the others
    spans, at = [], 0
    for sentence in _splitter(lang).split(" ".join(stripped.split())):
        ink = "".join(sentence.split())
        if not ink or "".join(text[i] for i in inked[at : at + len(ink)]) != ink:
            return whole
        spans.append((inked[at], inked[at + len(ink) - 1] + 1))
        at += len(ink)
    return spans if spans and at == len(inked) else whole


def split(text: str, lang: str = "en") -> list[str]:
    """The sentences of `text` (`sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text, lang)]


def separator(lang: str | None) -> str:
    """What joins translated sentences in `lang`: a space, or nothing for a script
    written without spaces."""
    return "" if (lang or "").split("-")[0].lower() in UNSPACED else " "

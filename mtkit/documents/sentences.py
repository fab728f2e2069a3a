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
    leaves the line whole."""
    stripped = text.strip()
    if not stripped:
        return []
    start = text.index(stripped[0])
    whole = [(start, start + len(stripped))]
    if not any(c in stripped for c in ".!?…"):  # nothing can end a sentence inside
        return whole
    spans, at = [], 0
    for sentence in _splitter(lang).split(stripped):
        found = text.find(sentence, at)
        if found < 0 or text[at:found].strip():
            return whole
        spans.append((found, found + len(sentence)))
        at = found + len(sentence)
    return spans if spans and not text[at:].strip() else whole


def split(text: str, lang: str = "en") -> list[str]:
    """The sentences of `text` (`sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text, lang)]


def separator(lang: str | None) -> str:
    """What joins translated sentences in `lang`: a space, or nothing for a script
    written without spaces."""
    return "" if (lang or "").split("-")[0].lower() in UNSPACED else " "

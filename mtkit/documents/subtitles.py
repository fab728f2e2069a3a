"""SubRip subtitles (.srt, through the `srt` package): every cue's number and timings
kept as they are, its text translated in context. A sentence that runs over several cues
(a cue that ends without . ! ? or …) is translated whole, and its words are handed back
to the cues their source words came from (through the word alignment, in order; by
length where the alignment leaves a cue without words). A cue keeps its number of lines.
Cues with markup (`<i>`, `<font>`) or override tags (`{\\an8}`) are translated one by
one, their tags carried through."""

from __future__ import annotations

import re

from mtkit.core.errors import UserError
from mtkit.core.translation import Translation
from mtkit.documents.messages import TAGGED, Translate, translate_messages
from mtkit.documents.placeholders import PLACEHOLDER, restore_numbers

SENTENCE_END = re.compile(r"[.!?…。！？][\"'»”’)\]]*$")
MOST_CUES = 4  # a sentence spreads over at most this many cues before it is cut


class SubtitleError(UserError, ValueError):
    """A subtitle file that cannot be read (one line)."""


def translate_srt(document: str, translate: Translate) -> str:
    """The .srt `document` translated with `translate` (texts in, `Translation`s with
    word alignments out): the same cues, numbers and timings, their text translated."""
    import srt

    try:
        cues = list(srt.parse(document))
    except (srt.SRTParseError, ValueError, OverflowError) as e:  # (a timing out of range)
        raise SubtitleError(f"not a SubRip (.srt) file: {str(e).splitlines()[0][:120]}") from None
    groups = _groups(cues)
    plain = [g for g in groups if len(g) > 1 or not _marked(cues[g[0]].content)]
    tagged = [g[0] for g in groups if g not in plain]
    texts = [" ".join(" ".join(cues[i].content.split()) for i in g) for g in plain]
    translated = translate(texts) if texts else []
    for group, t in zip(plain, translated, strict=True):
        t = restore_numbers(t)
        shares = _share(t, [len(cues[i].content.split()) for i in group])
        for i, words in zip(group, shares, strict=True):
            cues[i].content = _lines(words, cues[i].content.count("\n") + 1)
    messages = translate_messages([cues[i].content for i in tagged], translate)
    for i, text in zip(tagged, messages, strict=True):
        cues[i].content = text
    return srt.compose(cues, reindex=False, strict=False)


def _groups(cues) -> list[list[int]]:
    """Runs of cues that hold one sentence (at most `MOST_CUES`); a cue with markup is
    one on its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i, cue in enumerate(cues):
        if _marked(cue.content):
            groups += [current] if current else []
            groups.append([i])
            current = []
            continue
        current.append(i)
        if SENTENCE_END.search(cue.content.strip()) or len(current) == MOST_CUES:
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def _marked(text: str) -> bool:
    """Whether a cue holds markup or placeholders ({\\an8}, ...): translated on its own,
    with them carried through (`mtkit.documents.messages`)."""
    return bool(TAGGED.search(text) or PLACEHOLDER.search(text))


def _share(t: Translation, source_words: list[int]) -> list[list[str]]:
    """The target words of each cue of a group whose cues had `source_words` words: a
    target word goes to the cue of its first aligned source word, never to an earlier cue
    than the word before it; by length, where that leaves a cue without words."""
    words = t.text.split()
    if len(source_words) == 1:
        return [words]
    cue_of_word = [k for k, n in enumerate(source_words) for _ in range(n)]
    first: dict[int, int] = {}
    for s, w in t.alignment or ():
        if s < len(cue_of_word):
            first[w] = min(first.get(w, len(cue_of_word)), s)
    shares: list[list[str]] = [[] for _ in source_words]
    cue = 0
    for w, word in enumerate(words):
        if w in first:
            cue = max(cue, cue_of_word[first[w]])
        shares[cue].append(word)
    if all(shares) or len(words) < len(source_words):
        return shares
    total, out, at = sum(source_words) or 1, [], 0  # by length
    for k in range(len(source_words)):
        take = round(len(words) * sum(source_words[: k + 1]) / total) - at
        out.append(words[at : at + take])
        at += take
    return out


def _lines(words: list[str], lines: int) -> str:
    """`words` on `lines` lines of about equal length (a cue keeps its line count)."""
    if lines <= 1 or len(words) < 2:
        return " ".join(words)
    out, at, total = [], 0, sum(map(len, words)) + len(words)
    for k in range(1, lines):
        target, used, cut = total * k / lines, 0, at
        for j in range(len(words)):
            used += len(words[j]) + 1
            if used >= target:
                cut = max(j + 1, at + 1)
                break
        out.append(" ".join(words[at:cut]))
        at = cut
    out.append(" ".join(words[at:]))
    return "\n".join(x for x in out if x) or ""

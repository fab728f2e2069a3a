"""SubRip subtitles (.srt, read with the `srt` package): every cue's text translated in
context, and nothing else of the file touched: cue numbers, timing lines and blank lines
are kept byte for byte (a file without cue numbers stays without, a timing written
loosely stays as written). A sentence that runs over several cues (a cue that ends
without . ! ? or …) is translated whole, and its words are handed back to the cues their
source words came from (through the word alignment, in order; by length where the
alignment leaves a cue without words; cue by cue where even that would leave one
blank). A cue keeps its number of lines (its text's, the blank lines after it kept as
written). Cues with markup (`<i>`, `<font>`) or override tags (`{\\an8}`) are translated
one by one, each as one sentence, their tags carried through; a cue of dialogue (`- Yes.`
on a line after its first) one speaker at a time, each speaker's dash kept."""

from __future__ import annotations

import re

from mtkit.core.errors import UserError
from mtkit.core.translation import Translation
from mtkit.documents import messages
from mtkit.documents.messages import TAGGED
from mtkit.documents.placeholders import PLACEHOLDER, restore_numbers
from mtkit.documents.rounds import Rounds

SENTENCE_END = re.compile(r"[.!?…。！？][\"'»”’)\]]*$")
MOST_CUES = 4  # a sentence spreads over at most this many cues before it is cut
DASH = re.compile(r"\s*[-‐–—] ?(?=[^-‐–—\s\d])")  # a speaker's line in a dialogue: "- Yes."
TOKEN = re.compile(rf"(?:{TAGGED.pattern}|\S)+")  # a word with its tags: lines break between


class SubtitleError(UserError, ValueError):
    """A subtitle file that cannot be read (one line)."""


def rounds(document: str) -> Rounds[str]:
    """The .srt `document` translated (`mtkit.documents.rounds.Rounds`, three rounds):
    the same cues, numbers and timings, their text translated."""
    import srt

    try:
        # a cue's text ends at its last character that is not whitespace: the blank (or
        # whitespace-only) lines the reader counts in are kept as written, not its lines
        texts = [cue.content.rstrip() for cue in srt.parse(document)]
    except (srt.SRTParseError, ValueError, OverflowError) as e:  # (a timing out of range)
        raise SubtitleError(f"not a SubRip (.srt) file: {str(e).splitlines()[0][:120]}") from None
    groups = _groups(texts)
    plain = [g for g in groups if len(g) > 1 or not _marked(texts[g[0]])]
    tagged = [g[0] for g in groups if g not in plain]
    short = yield from _put_back(texts, plain)
    # A sentence whose translation has fewer words than it has cues ("Yes, / yes, / yes, /
    # yes." as "Ja."), or whose words the alignment and the lengths leave a cue without,
    # would show a blank cue while its words are spoken: its cues are translated one by
    # one instead, each its own text in its own time.
    yield from _put_back(texts, [[i] for g in short for i in g])
    # A speaker's lines are one text to translate (a line break is no sentence's end);
    # the translation is broken into as many lines again, after the speaker's dash.
    turns = {i: _turns(texts[i]) for i in tagged}
    said = iter((yield from messages.rounds([" ".join(t) for i in tagged for _, t in turns[i]])))
    for i in tagged:
        texts[i] = "\n".join(
            dash + _lines(TOKEN.findall(next(said)), len(lines)) for dash, lines in turns[i]
        )
    eol = "\r\n" if "\r\n" in document else "\n"
    out, at = [], 0
    for match, text in zip(srt.SRT_REGEX.finditer(document), texts, strict=True):
        start, end = match.span(5)  # the cue's text (`srt.parse` read the same matches)
        out += [document[at:start], text.replace("\n", eol)]
        at = start + len(document[start:end].rstrip())
    return "".join(out) + document[at:]


def _put_back(texts: list[str], groups: list[list[int]]) -> Rounds[list[list[int]]]:
    """Each group of cues (indices into `texts`) translated as one text (a round), and
    its words handed back to its cues (`_share`) in `texts`; the groups where that would
    leave a cue that had words without any are left as they were, and returned."""
    joined = [" ".join(w for i in g for w in texts[i].split()) for g in groups]
    translated = yield joined
    short = []
    for group, t in zip(groups, translated, strict=True):
        counts = [len(texts[i].split()) for i in group]
        shares = _share(restore_numbers(t), counts)
        if len(group) > 1 and any(n and not s for n, s in zip(counts, shares, strict=True)):
            short.append(group)
            continue
        for i, words in zip(group, shares, strict=True):
            texts[i] = _lines(words, texts[i].count("\n") + 1)
    return short


def _groups(texts: list[str]) -> list[list[int]]:
    """Runs of cues (their `texts`) that hold one sentence (at most `MOST_CUES`); a cue
    with markup is one on its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i, text in enumerate(texts):
        if _marked(text):
            groups += [current] if current else []
            groups.append([i])
            current = []
            continue
        current.append(i)
        if SENTENCE_END.search(text.strip()) or len(current) == MOST_CUES:
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def _marked(text: str) -> bool:
    """Whether a cue holds markup or placeholders ({\\an8}, ...), or the lines of more
    than one speaker: translated on its own, with them carried through
    (`mtkit.documents.messages`), each speaker's lines a text of their own."""
    return bool(TAGGED.search(text) or PLACEHOLDER.search(text) or len(_turns(text)) > 1)


def _turns(text: str) -> list[tuple[str, list[str]]]:
    """A cue's text by speaker: each line that starts with a dialogue dash starts a
    speaker's turn, the dash (kept out of the translation, where a model would drop it)
    and the lines of the turn, their dashes taken off."""
    turns: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        dash = DASH.match(line)
        if dash or not turns:
            turns.append((dash.group() if dash else "", [line[dash.end() if dash else 0 :]]))
        else:
            turns[-1][1].append(line)
    return turns


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
    """`words` on `lines` lines of about equal length, tags not counted (a cue keeps its
    line count)."""
    if lines <= 1 or len(words) < 2:
        return " ".join(words)
    sizes = [len(TAGGED.sub("", w)) for w in words]
    out, at, total = [], 0, sum(sizes) + len(words)
    for k in range(1, lines):
        target, used, cut = total * k / lines, 0, at
        for j in range(len(words)):
            used += sizes[j] + 1
            if used >= target:
                cut = max(j + 1, at + 1)
                break
        out.append(" ".join(words[at:cut]))
        at = cut
    out.append(" ".join(words[at:]))
    return "\n".join(x for x in out if x) or ""

"""Translations made without a model, for the document tests: each a `translate` (texts
in, `Translation`s with word alignments out) whose output and links are known, so that a
test can say exactly where each tag must land."""

from __future__ import annotations

import random

from mtkit.core.translation import Translation


def upper(texts: list[str]) -> list[Translation]:
    """Each word in capitals, in place: word i is linked to word i."""
    out = []
    for text in texts:
        words = text.split()
        links = tuple((i, i) for i in range(len(words)))
        out.append(Translation(text, " ".join(w.upper() for w in words), -1.0, -0.5, (), links))
    return out


def reverse(texts: list[str]) -> list[Translation]:
    """The words in reverse order: word i is linked to word n - 1 - i."""
    return _reversed(texts, str)


def reverse_upper(texts: list[str]) -> list[Translation]:
    """The words in reverse order, in capitals (a changed word is seen to be translated)."""
    return _reversed(texts, str.upper)


def _reversed(texts: list[str], case) -> list[Translation]:
    out = []
    for text in texts:
        words = text.split()
        n = len(words)
        links = tuple((i, n - 1 - i) for i in range(n))
        target = " ".join(case(w) for w in reversed(words))
        out.append(Translation(text, target, -1.0, -0.5, (), links))
    return out


def scrambled(seed: int, fewest: int = 0):
    """Any number of target words (`fewest` at least, 8 at most), any links at all (some
    words linked to none)."""
    rng = random.Random(seed)

    def translate(texts: list[str]) -> list[Translation]:
        out = []
        for text in texts:
            n, m = len(text.split()), rng.randint(fewest, 8)
            links = {
                (rng.randrange(n), rng.randrange(m))
                for _ in range(rng.randint(0, 6) if n and m else 0)
            }
            words = [f"w{k}" for k in range(m)]
            out.append(
                Translation(
                    text, " ".join(words), -1.0, -0.5, (), tuple(sorted(links)) if n and m else ()
                )
            )
        return out

    return translate

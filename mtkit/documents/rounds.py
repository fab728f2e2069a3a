"""The shape every document is translated in (`Rounds`), whatever its format: a
generator that yields the texts it needs translated, is sent their translations, round
after round, and returns the translated document (html, xml and po take one round; srt
three, the second's texts chosen by the first's translations). `translate_rounds` drives
the documents of a call together: each round's texts of all of them in one batch."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from mtkit.core.translation import Translation

# texts in, `Translation`s with word alignments out, in order: the one session's batch
Translate = Callable[[list[str]], list[Translation]]
T = TypeVar("T")
# A document (or a list of messages) being translated: it yields the texts it needs,
# is sent their translations (`Translation`s with word alignments, in order), and
# returns what it becomes (`translate_rounds` drives it).
Rounds = Generator[list[str], list[Translation], T]


def translate_rounds(
    rounds: list[Rounds[T]], translate: Translate
) -> list[tuple[T, list[Translation]]]:
    """Each of `rounds` driven to its end: in each round the texts all of them still
    want go to one call of `translate` (none where they want none); each one's result,
    with every translation it was sent, in order."""
    done: dict[int, T] = {}
    parts: list[list[Translation]] = [[] for _ in rounds]
    wanted: dict[int, list[str]] = {}

    def send(i: int, translated: list[Translation] | None) -> None:
        try:
            wanted[i] = rounds[i].send(translated)
        except StopIteration as end:
            done[i] = end.value

    for i in range(len(rounds)):
        send(i, None)
    while wanted:
        asked, wanted = wanted, {}
        texts = [t for want in asked.values() for t in want]
        translated = translate(texts) if texts else []
        at = 0
        for i, want in asked.items():
            mine = translated[at : at + len(want)]
            at += len(want)
            parts[i] += mine
            send(i, mine)
    return [(done[i], parts[i]) for i in range(len(rounds))]

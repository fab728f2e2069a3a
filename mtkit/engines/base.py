"""What every engine does to its input before the search: set empty lines aside, encode
and truncate the others, encode target prefixes, refuse the options it cannot honour."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mtkit.decoding import Capabilities, SearchOptions, check, flag
from mtkit.hypothesis import Hypothesis
from mtkit.vocab import Vocab

log = logging.getLogger(__name__)


class Engine:
    """The shared half of an engine (`mtkit.decoding.Translator`). Subclasses set
    `src_vocab`, `tgt_vocab`, `max_positions`, `capabilities`, `config`, `steps`, and
    search in `translate`."""

    src_vocab: Vocab
    tgt_vocab: Vocab
    max_positions: int
    capabilities: Capabilities

    def __init__(self) -> None:
        self._truncated: set[str] = set()  # the kinds of text already warned about

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        """One line for anything in `options` this engine cannot do."""
        check(options, self.capabilities, spell)

    @property
    def max_src_tokens(self) -> int:
        return self.max_positions - 1  # room for eos

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self._cut(self.src_vocab.encode(lines), self.max_src_tokens, "input lines")

    def _cut(self, ids: list[list[int]], limit: int, what: str) -> list[list[int]]:
        """Each of `ids` cut to `limit` pieces; the first cut of each kind is logged."""
        if all(len(x) <= limit for x in ids):
            return ids
        if what not in self._truncated:
            log.warning("%s longer than %d subwords are truncated (model.max_positions=%d)",
                        what, limit, self.max_positions)
            self._truncated.add(what)
        return [x[:limit] for x in ids]

    def prepare(self, lines: list[str], opts: SearchOptions, done: Callable[[int], None],
                prefixes: list[str] | None
                ) -> tuple[list[list[Hypothesis]], list[int], list[list[int]],
                           list[list[int]] | None]:
        """Empty lines answered (an empty hypothesis each; `done` is told), the others
        encoded: the results so far, the indices of the lines left, their source ids
        and their target prefix ids (None without prefixes)."""
        out: list[list[Hypothesis]] = [[] for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        empty = [Hypothesis([], 0.0, 0.0, () if opts.alignments else None)] * opts.nbest
        for i in set(range(len(lines))) - set(todo):
            out[i] = empty
        done(len(lines) - len(todo))
        ids = self.encode([lines[i] for i in todo]) if todo else []
        forced = (self._cut(self.tgt_vocab.encode([prefixes[i] for i in todo]),
                            self.max_src_tokens - 1, "target prefixes")  # room for eos
                  if prefixes and todo else None)
        return out, todo, ids, forced

"""Continuous batching for `mtkit serve`: lines join a running greedy search between any
two of its steps and leave it as they end.

`LineStream` takes text lines (a key each) for the PyTorch engine: it encodes them as
the engine does and feeds `GreedyStream`, which decodes them in the slots of a
`SlotCache`. A line's output is what `TorchEngine.translate` gives it alone.
"""

from __future__ import annotations

from collections.abc import Hashable

from mtkit.decoding import SearchOptions, Translator
from mtkit.engines.pytorch import TorchEngine, pad_rows
from mtkit.hypothesis import Hypothesis
from mtkit.search import GreedyStream
from mtkit.vocab import EOS


def open_stream(engine: Translator, opts: SearchOptions) -> LineStream | None:
    """A stream for requests with these options, or None where the engine has none for
    them (then they are translated in rounds)."""
    if not (engine.capabilities.streaming and LineStream.can_take(opts)):
        return None
    return LineStream(engine, opts)


class LineStream:
    """Lines translated with continuous batching: `add` lines (a key each) between any
    two steps and they join the running greedy search (`GreedyStream`); each `step`
    returns the lines that ended, with their hypotheses.

    Takes the requests whose options differ from the first's at most in alignments."""

    def __init__(self, engine: TorchEngine, opts: SearchOptions):
        self.engine, self.opts = engine, opts
        self.search = GreedyStream(engine.model, opts.lenpen, opts.max_len_a, opts.max_len_b)
        self.ready: list[tuple[Hashable, list[Hypothesis]]] = []  # empty lines
        self.joining: list[tuple[Hashable, list[int]]] = []  # key, source ids
        self.aligned: dict[Hashable, tuple[list[int], int | None]] = {}  # key -> ids, layer

    @staticmethod
    def can_take(opts: SearchOptions) -> bool:
        """Whether these options decode greedily, with nothing a stream cannot do."""
        return opts.beam == 1 and not opts.sampling and not opts.no_repeat_ngram

    def accepts(self, opts: SearchOptions) -> bool:
        def searched(o: SearchOptions) -> SearchOptions:
            return o.but(alignments=False, align_layer=None)

        return self.can_take(opts) and searched(opts) == searched(self.opts)

    def __len__(self) -> int:
        """Lines taken and not yet returned."""
        return len(self.search) + len(self.ready) + len(self.joining)

    def add(self, lines: list[str], keys: list[Hashable], opts: SearchOptions) -> None:
        """Lines (a key each) that join the search at the next step: all those added
        between two steps are encoded together."""
        self.engine.check(opts)
        out, todo, ids, _ = self.engine.prepare(lines, opts, lambda n: None, None)
        taken = set(todo)
        self.ready += [(keys[i], out[i]) for i in range(len(lines)) if i not in taken]
        self.joining += [(keys[i], x) for i, x in zip(todo, ids, strict=True)]
        if opts.alignments:
            self.aligned.update((keys[i], (x, opts.align_layer))
                                for i, x in zip(todo, ids, strict=True))

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One token for every line; the lines that ended: (key, hypotheses) each."""
        finished, self.ready = self.ready, []
        with self.engine.autocast():
            if self.joining:
                src = pad_rows([x + [EOS] for _, x in self.joining])  # (B, S)
                self.search.add(src.to(self.engine.device), [k for k, _ in self.joining])
                self.joining = []
            ended = self.search.step()
        for key, hyp in ended:
            if key in self.aligned:
                ids, layer = self.aligned.pop(key)
                finished.append((key, self.engine.with_alignments([ids], [[hyp]], layer)[0]))
            else:
                finished.append((key, [hyp]))
        return finished

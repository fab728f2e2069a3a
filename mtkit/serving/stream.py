"""Continuous batching for `mtkit serve`: lines join a running greedy search between any
two of its steps and leave it as they end.

`GreedyStream` decodes sentences of ids, each in its own slot of a slot cache
(`cache.SlotCache`: one sentence's joining or leaving copies no other's keys and values).
What it needs of a model is `StreamModel`: a `Transformer`, or an `Ensemble` of them. The
decoding constraints are those of offline greedy search (`beam.step_log_probs`), so
that each output is the one `beam.greedy_hypotheses` gives its sentence alone.

`LineStream` takes text lines (a key each) for the PyTorch engine: it encodes them as the
engine does and feeds a `GreedyStream`; `open_stream` makes one where the engine and the
options allow it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import Tensor

from mtkit.core.hypothesis import Hypothesis
from mtkit.core.search_options import DEFAULTS, SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.engines.base import Engine
from mtkit.engines.pytorch import TorchEngine
from mtkit.model.cache import resize
from mtkit.search.beam import as_hypotheses, max_lengths, padded, step_log_probs, step_shapes


class StreamCache(Protocol):
    """What the stream does with its model's slot cache besides stepping it (a
    `cache.SlotCache`, or an `ensemble.EnsembleCache` of them)."""

    def fill(self, slots: Tensor, sources: Any) -> None: ...  # sources: from `cross_kv`

    def resized(self, slots: int, columns: int, source_capacity: int) -> StreamCache: ...

    def move(self, old: Tensor, new: Tensor) -> None: ...


class StreamModel(Protocol):
    """What `GreedyStream` needs of a model (`model.Transformer`, `ensemble.Ensemble`)."""

    cfg: Any  # cfg.max_positions: the longest output

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...  # (B, S, D), (B, S)

    def cross_kv(self, memory: Tensor) -> Any: ...  # the sources' keys/values, to `fill`

    def slot_cache(
        self, sources: Any, slots: int, columns: int, source_capacity: int, fixed: bool
    ) -> StreamCache: ...  # free slots for such sources (`fixed`: stepped all at once)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any
    ) -> tuple[Tensor, Any]: ...  # steps the first B slots


# Source tokens (with padding) encoded together on a CPU by `GreedyStream`, whose
# sentences join unsorted: sorted by length in chunks of about 512 tokens they pad less
# and encode faster than all at once (`benchmarks/serve_load.py`'s requests). A GPU takes
# them whole.
ENCODE_CHUNK_TOKENS = 512


def encode_in_chunks(model: StreamModel, src: Tensor) -> tuple[Tensor, Tensor]:
    """`model.encode(src)`; on a CPU, rows of similar length are encoded together, in
    chunks of at most `ENCODE_CHUNK_TOKENS` tokens with padding (the memory and mask
    padded back to src's width, rows in src's order)."""
    rows, width = src.shape
    if src.device.type != "cpu" or rows * width <= ENCODE_CHUNK_TOKENS:
        return model.encode(src)
    lengths = (src != PAD).sum(dim=1)  # (B,)
    order = lengths.argsort(descending=True)
    sorted_lengths = lengths[order].tolist()
    memories, masks, start = [], [], 0
    while start < rows:  # a chunk as wide as its first (longest) row
        longest = max(sorted_lengths[start], 1)
        count = max(1, ENCODE_CHUNK_TOKENS // longest)
        chunk = src.index_select(0, order[start : start + count])[:, :longest]
        memory, src_mask = model.encode(chunk)
        memories.append(torch.nn.functional.pad(memory, (0, 0, 0, width - longest)))
        masks.append(torch.nn.functional.pad(src_mask, (0, width - longest), value=False))
        start += count
    back = order.argsort()  # sorted position of each row
    return torch.cat(memories).index_select(0, back), torch.cat(masks).index_select(0, back)


class GreedyStream:
    """Greedy decoding with continuous batching: sentences `add`ed between any two steps
    join the running batch, and each `step` returns those that ended. A server keeps its
    batch full this way, where fixed rounds wait for their slowest sentence and then
    start small. Each output is the one `greedy_hypotheses` gives its sentence alone.

    The sentences live in the slots of the model's slot cache (`slot_cache`;
    `decode_step` steps its first B slots): one joining or leaving copies no other's
    cache. When sentences end, those in the last slots move into the freed ones, so that
    a step runs live slots only. Beside the cache, the stream keeps each slot's last
    token, output limit, tokens so far, log-probability, output and source mask.

    Of `options` it reads the length penalty and limits. A model in fixed shapes
    (`beam.step_shapes`: captured steps on a GPU, `mtkit.search.captured`) has every step
    run all slots over the cache's whole capacities (`SlotCache.fixed`), free slots
    masked, so that steps have the same shapes until the capacities change; the outputs
    are the same. Each slot's source mask then always holds its first position, so that a free
    slot attends to something (an empty mask would make its keys and values NaN, which
    a later sentence in that slot would read, weighted 0, as NaN)."""

    def __init__(self, model: StreamModel, options: SearchOptions = DEFAULTS, *, min_len: int = 1):
        self.model, self.options, self.min_len = model, options, min_len
        self.fixed = step_shapes(model).fixed  # step all slots over all columns
        self._clear()

    def _clear(self) -> None:
        """No slots, no cache: the memory goes."""
        self.keys: list[Any] = []  # the caller's key of each slot (None: free)
        self.live = 0  # sentences in the slots
        self.cache: StreamCache | None = None
        self.token: Tensor | None = None  # (slots,) last token
        self.limits: Tensor | None = None  # (slots,) output limit
        self.steps: Tensor | None = None  # (slots,) tokens output so far
        self.log_prob: Tensor | None = None  # (slots,)
        self.out: Tensor | None = None  # (slots, C) output so far
        self.src_mask: Tensor | None = None  # (slots, P) True at real source tokens

    def __len__(self) -> int:
        """Sentences being decoded (in slots 0..len-1: `_compact`)."""
        return self.live

    @property
    def capacity(self) -> tuple[int, int, int]:
        """Slots, target columns C and source positions P, of the cache and the stream."""
        return self.out.size(0), self.out.size(1), self.src_mask.size(1)

    @torch.no_grad()
    def add(self, src: Tensor, keys: list[Any]) -> None:
        """Sentences src (B, S), one key each, join the search at its next step."""
        memory, src_mask = encode_in_chunks(self.model, src)  # (B, S, D), (B, S)
        limits = max_lengths(
            src_mask, self.options.max_len_a, self.options.max_len_b, self.model.cfg.max_positions
        )  # (B,)
        sources = self.model.cross_kv(memory)  # per layer (B, H, S, K) (per model)
        b, n, width = len(self), src.size(0), src.size(1)
        if self.cache is None:  # caches in the keys' dtype (bf16 under CUDA autocast)
            columns = int(limits.max()) + 1
            self.cache = self.model.slot_cache(sources, n, columns, width, self.fixed)
            self._empty_rows(src.device)
            self._resize_rows(n, columns, width)
        else:
            self._fit(b + n, int(limits.max()) + 1, width)
        free = list(range(b, b + n))  # live slots are 0..b-1 (`_compact`)
        slots = torch.tensor(free, dtype=torch.long, device=src.device)
        self.cache.fill(slots, sources)
        self.src_mask[slots] = False
        self.src_mask[slots, :width] = src_mask
        self.token[slots] = BOS
        self.limits[slots] = limits
        self.steps[slots] = 0
        self.log_prob[slots] = 0.0
        self.out[slots] = PAD
        for slot, key in zip(free, keys, strict=True):
            self.keys[slot] = key
        self.live += n

    def _fit(self, slots: int, columns: int, source: int) -> None:
        """Make the cache hold `slots` sentences of up to `columns` output tokens and
        `source` source tokens, with those live now. It grows with a quarter to spare,
        and shrinks once it is over twice what is needed (as after a long sentence)."""
        b = len(self)
        if b:
            columns = max(columns, int(self.limits[:b].max()) + 1)
            source = max(source, int(self.src_mask[:b].sum(dim=1).max()))
        need = (slots, columns, source)
        if all(n <= h <= 2 * n + 8 for h, n in zip(self.capacity, need, strict=True)):
            return
        new = [n + n // 4 for n in need]
        new[1] = min(new[1], self.model.cfg.max_positions)  # no output is longer
        self.cache = self.cache.resized(*new)
        self._resize_rows(*new)

    def _empty_rows(self, device: torch.device) -> None:
        """Per-slot tensors for no slot yet, for `_resize_rows` to grow."""
        empty = torch.zeros(0, dtype=torch.long, device=device)  # each resized into its own
        self.token = self.limits = self.steps = empty
        self.log_prob = torch.zeros(0, dtype=torch.float, device=device)
        self.out = empty.view(0, 0)
        self.src_mask = torch.zeros(0, 0, dtype=torch.bool, device=device)

    def _resize_rows(self, slots: int, columns: int, source: int) -> None:
        """Per-slot tensors for `slots` slots, outputs of `columns` tokens and sources of
        `source` tokens (what fits is kept)."""
        self.token = resize(self.token, (slots,), BOS)
        self.limits = resize(self.limits, (slots,), 1)
        self.steps = resize(self.steps, (slots,), 0)
        self.log_prob = resize(self.log_prob, (slots,), 0.0)
        self.out = resize(self.out, (slots, columns), PAD)
        self.src_mask = resize(self.src_mask, (slots, source), False)
        self.src_mask[:, 0] = True  # a free slot's too (a live one's first is real)
        self.keys = (self.keys + [None] * slots)[:slots]

    @torch.no_grad()
    def step(self) -> list[tuple[Any, Hypothesis]]:
        """One token for every sentence; those that end leave: (key, hypothesis) each."""
        b = len(self)  # the live slots: 0..b-1 (`_compact`)
        if not b:
            return []
        stepped = self.token.size(0) if self.fixed else b  # all slots, or the live ones
        src_mask = self.src_mask[:stepped]
        if not self.fixed:
            src_mask = src_mask[:, : int(src_mask.sum(dim=1).max())]  # to the longest source
        lprobs, self.cache = step_log_probs(
            self.model,
            self.token[:stepped],
            None,
            src_mask,
            self.cache,
            self.steps[:stepped],
            self.limits[:stepped],
            self.min_len,
        )  # (stepped, V)
        token = lprobs[:b].argmax(dim=-1)  # (b,)
        rows = torch.arange(b, device=token.device)
        self.log_prob[:b] += lprobs[rows, token]
        self.out[rows, self.steps[:b]] = token
        self.steps[:b] += 1
        self.token[:b] = token
        ended = (token == EOS).nonzero().squeeze(1)
        if not ended.numel():
            return []
        hyps = as_hypotheses(self.out[ended], self.log_prob[ended], 1, self.options.lenpen)
        finished = []
        for slot, h in zip(ended.tolist(), hyps, strict=True):
            finished.append((self.keys[slot], h[0]))
            self.keys[slot] = None
        self.live -= len(finished)
        self._compact()
        if len(self):
            self._fit(len(self), 1, 1)
        else:  # nothing left: let the memory go
            self._clear()
        return finished

    def _compact(self) -> None:
        """Live slots at the back move into the free ones at the front, so that steps
        run live slots only."""
        holes = [i for i, k in enumerate(self.keys[: self.live]) if k is None]
        if not holes:
            return
        movers = [i for i, k in enumerate(self.keys) if k is not None and i >= self.live]
        old, new = (
            torch.tensor(x, dtype=torch.long, device=self.token.device) for x in (movers, holes)
        )
        self.cache.move(old, new)
        for t in (self.token, self.limits, self.steps, self.log_prob, self.out, self.src_mask):
            t[new] = t[old]
        for i, j in zip(movers, holes, strict=True):
            self.keys[j], self.keys[i] = self.keys[i], None


def open_stream(engine: Engine, opts: SearchOptions) -> LineStream | None:
    """A stream for requests with these options, or None where the engine has none for
    them (then they are translated in rounds): also where a multilingual model keeps
    each language's outputs to its pieces (`EngineBase.output_groups`), which a stream's
    rows, of any language, do not."""
    if not (engine.capabilities.streaming and LineStream.can_take(opts)) or (
        opts.lang_vocab and engine.tgt_vocab.languages
    ):
        return None
    return LineStream(engine, opts)


class LineStream:
    """Lines translated with continuous batching: `add` lines (a key each) between any
    two steps and they join the running greedy search (`GreedyStream`); each `step`
    returns the lines that ended, with their hypotheses.

    Takes the requests whose options differ from the first's at most in alignments."""

    def __init__(self, engine: TorchEngine, opts: SearchOptions):
        self.engine, self.opts = engine, opts
        self.search = GreedyStream(engine.step_model, opts)
        self.ready: list[tuple[Hashable, list[Hypothesis]]] = []  # empty lines
        self.joining: list[tuple[Hashable, list[int]]] = []  # key, source ids
        self.aligned: dict[Hashable, tuple[list[int], int | None]] = {}  # key -> ids, layer

    @staticmethod
    def can_take(opts: SearchOptions) -> bool:
        """Whether these options decode greedily, with nothing a stream cannot do."""
        return opts.beam == 1 and not opts.sampling and not opts.no_repeat_ngram

    def accepts(self, opts: SearchOptions) -> bool:
        def searched(o: SearchOptions) -> SearchOptions:
            return replace(o, alignments=False, align_layer=None)

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
            self.aligned.update(
                (keys[i], (x, opts.align_layer)) for i, x in zip(todo, ids, strict=True)
            )

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """One token for every line; the lines that ended: (key, hypotheses) each."""
        finished, self.ready = self.ready, []
        with self.engine.searching():  # the slot cache is made and written only here
            if self.joining:
                src = padded([x + [EOS] for _, x in self.joining])  # (B, S)
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

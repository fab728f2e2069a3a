"""The decoder's caches: what `Transformer.decode_step` carries from one step to the next.

A cache holds each decoder layer's self-attention keys/values of the target tokens so
far and its cross-attention keys/values of the source, computed once per sentence. The
model sees it through `DecoderCache`, step by step:

    start = cache.begin(rows)                  # position(s) of this step's token
    k, v = cache.cross(layer, source_width)    # the layer's source keys/values
    k, v, mask = cache.update(layer, k, v)     # this step's keys/values in, all so far out
    cache = cache.advanced(new_k, new_v)       # the cache after the step

- `BeamCache` (offline search): a value, one row per beam, that search reorders with
  one `index_select` per step.
- `PreallocatedCache` (offline search in fixed shapes, for captured steps on a GPU:
  `mtkit.search.captured`): a `BeamCache` whose keys/values are preallocated for the
  batch's length limit and written in place, so that every step has the same shapes.
- `SlotCache` (continuous batching, `mtkit.serving.stream`): a fixed number of slots,
  each holding one sentence or free, written in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor


class DecoderCache(Protocol):
    """What `Transformer.decode_step` asks of its cache (one new token per row)."""

    # Every step the same shapes (`mtkit.search.captured` may capture it), its positions
    # within its capacity, itself within the model's positions: not checked by a step
    fixed_shapes: bool

    def begin(self, rows: int) -> int | Tensor:
        """A step of `rows` rows begins: the position of its token, for all rows (int)
        or for each (rows,)."""
        ...

    def cross(self, layer: int, source_width: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s cross-attention keys/values: (sentences, H, S, K), S =
        `source_width`, that of the step's source mask."""
        ...

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """This step's self-attention keys/values (rows, H, 1, K) of layer `layer` in;
        out those to attend to, (rows, H, t+1, K), and the mask of which each row may
        see (rows, 1, 1, t+1), True = may attend, or None: all."""
        ...

    def advanced(self, new_k: tuple[Tensor, ...], new_v: tuple[Tensor, ...]) -> DecoderCache:
        """The cache after the step, given what `update` returned for each layer."""
        ...


@dataclass(frozen=True)
class BeamCache:
    """The cache of offline search, one entry per decoder layer: self-attention
    keys/values of the tokens so far (R, H, t, K), and cross-attention keys/values of
    each sentence's source, computed once (B, H, S, K). Before the first step (`first`)
    it holds no self-attention entries.

    Search reorders the rows at every step (beams that go on, sentences that leave),
    which is only recorded: `rows` (B*W,) says which stored row each row of the next step
    continues (None: row i continues row i), composed over every `index_select` since
    the last step. The next step's `update` makes each layer's keys/values of all
    positions in one copy, the reorder and the new position together, where a reorder
    then a concatenation would copy them twice (the largest tensors of a search after
    the logits).

    A step spends the cache it is given: `update` lets go of each layer's old keys and
    values as soon as it has made the new ones, so a search holds its caches about once,
    not twice (the old ones until the step returned, and the step's logits beside them).
    Use the cache the step returns; a spent one refuses another step. Each cache (and each
    `index_select` of it) has its own lists of layers, so a copy made before the step is
    not spent by it."""

    self_k: list[Tensor | None]  # a tuple given is made a list of this cache's own
    self_v: list[Tensor | None]
    cross_k: tuple[Tensor, ...]
    cross_v: tuple[Tensor, ...]
    rows: Tensor | None = None

    fixed_shapes = False  # a class attribute, not a field

    def __post_init__(self) -> None:
        object.__setattr__(self, "self_k", list(self.self_k))
        object.__setattr__(self, "self_v", list(self.self_v))

    @staticmethod
    def first(cross_k: tuple[Tensor, ...], cross_v: tuple[Tensor, ...]) -> BeamCache:
        """The cache of the first step: the sources' keys/values (B, H, S, K) per layer,
        made contiguous once. Split into heads they are views with the heads between
        the positions, which every step's attention products would otherwise copy."""
        return BeamCache(
            [],
            [],
            tuple(k.contiguous() for k in cross_k),
            tuple(v.contiguous() for v in cross_v),
        )

    @property
    def length(self) -> int:
        """Target positions decoded so far."""
        return self.self_k[0].size(2) if self.self_k and self.self_k[0] is not None else 0

    def index_select(self, rows: Tensor, sentences: Tensor | None = None) -> BeamCache:
        """Reorder (or subset) the rows: beam search calls this once per step, and the
        reorder is only recorded (`rows`). The source's keys/values belong to sentences,
        not rows: `sentences` picks those that stay (None: all of them, as when beams
        are only reordered)."""

        def pick(ts: tuple[Tensor, ...], index: Tensor | None) -> tuple[Tensor, ...]:
            return ts if index is None else tuple(t.index_select(0, index) for t in ts)

        # `rows` is kept as given (not copied): callers never write into an index
        composed = rows if self.rows is None else self.rows.index_select(0, rows)  # (R',)
        return BeamCache(
            self.self_k,
            self.self_v,
            pick(self.cross_k, sentences),
            pick(self.cross_v, sentences),
            composed,
        )

    def layer(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s self-attention keys/values of the rows as they are now (R, H,
        t, K), the recorded reorder applied (a copy; `update` does without it)."""
        k, v = self.self_k[layer], self.self_v[layer]
        if self.rows is None:
            return k, v
        return k.index_select(0, self.rows), v.index_select(0, self.rows)

    def begin(self, rows: int) -> int:
        return self.length

    def cross(self, layer: int, source_width: int) -> tuple[Tensor, Tensor]:
        return self.cross_k[layer], self.cross_v[layer]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, None]:
        """Each row sees all its earlier positions: no mask. The stored rows, in the
        recorded order, and the step's position are written in one copy."""
        if not self.self_k:  # the first step
            return k, v, None
        if self.self_k[layer] is None:
            raise RuntimeError(
                "this decoder cache was spent by a step: use the cache the step returned"
            )
        k = self._append(self.self_k[layer], k)
        self.self_k[layer] = None  # the old keys go now, before the next layer's are made
        v = self._append(self.self_v[layer], v)
        self.self_v[layer] = None
        return k, v, None

    def _append(self, old: Tensor, new: Tensor) -> Tensor:
        """old (R, H, t, K) reordered by `rows`, then new (R', H, 1, K): (R', H, t+1, K)."""
        rows, heads, t, dim = new.size(0), old.size(1), old.size(2), old.size(3)
        out = new.new_empty(rows, heads, t + 1, dim)  # (R', H, t+1, K)
        if self.rows is None:
            out[:, :, :t] = old
        elif torch.is_grad_enabled():  # autograd cannot follow `out=`
            out[:, :, :t] = old.index_select(0, self.rows)
        else:
            torch.index_select(old, 0, self.rows, out=out[:, :, :t])
        out[:, :, t:] = new
        return out

    def advanced(self, new_k: tuple[Tensor, ...], new_v: tuple[Tensor, ...]) -> BeamCache:
        return BeamCache(new_k, new_v, self.cross_k, self.cross_v)

    def preallocated(self, capacity: int) -> PreallocatedCache:
        """This cache with room for `capacity` target positions (`PreallocatedCache`)."""
        return PreallocatedCache.of(self, capacity)


CAPACITY_STEP = 16  # a preallocated cache's capacity is a multiple of this (fewer shapes)


def preallocated_capacity(longest: int, max_positions: int) -> int:
    """Target positions to preallocate for outputs of at most `longest` tokens (their
    positions 0..longest, bos first): rounded up to a multiple of `CAPACITY_STEP`, so
    that batches of similar limits share a shape, within the model's positions."""
    return min(-(-(longest + 1) // CAPACITY_STEP) * CAPACITY_STEP, max_positions)


@dataclass
class PreallocatedCache:
    """A beam search's cache in fixed shapes: each layer's self-attention keys/values
    preallocated for C target positions (R, H, C, K) and written in place, and the
    sources' keys/values (B, H, S, K). Every step has the same shapes (what a captured
    step needs: `mtkit.search.captured`): the step's token is written at column
    `position`, and the step attends over all C columns, with a mask of those written so
    far (a masked column weighs exactly 0, so the outputs are `BeamCache`'s, up to
    rounding).

    Reorders keep the shapes too: `index_select` of the rows composes them into `rows`
    (in place), and the next step's `update` reorders each layer's keys/values in place
    before writing its own. Sentences that leave the batch (`index_select` with
    `sentences`) make a new, smaller cache: a new shape, which search makes rarely
    (`mtkit.search.beam`: sentences leave at bucket boundaries).

    A cache is one object through a search: `index_select` without `sentences`,
    `begin`, `update` and `advanced` change it and return it. The position is a device
    tensor, moved on by the step itself: nothing of a step waits for the host."""

    self_k: list[Tensor]  # per layer (R, H, C, K)
    self_v: list[Tensor]
    cross_k: tuple[Tensor, ...]  # per layer (B, H, S, K)
    cross_v: tuple[Tensor, ...]
    position: Tensor  # () long: the position of the next step's token
    rows: Tensor  # (R,) the stored row each row continues (identity after a step)
    _identity: Tensor = field(repr=False)  # (R,) 0..R-1
    _columns: Tensor = field(repr=False)  # (C,) 0..C-1
    _seen: Tensor | None = field(default=None, repr=False)  # (1, 1, 1, C) of the step

    @staticmethod
    def of(cache: BeamCache, capacity: int) -> PreallocatedCache:
        """`cache` (after at least one step) in C = `capacity` columns: its rows in
        their recorded order, its t positions in columns 0..t-1."""
        if not cache.self_k:
            raise ValueError("a cache is preallocated after its first step")
        t = cache.length
        if capacity < t + 1:
            raise ValueError(f"a capacity of {capacity} leaves no room after {t} positions")
        keys, values = [], []
        for layer in range(len(cache.self_k)):
            k, v = cache.layer(layer)  # (R, H, t, K)
            for old, out in ((k, keys), (v, values)):
                new = old.new_zeros(old.size(0), old.size(1), capacity, old.size(3))
                new[:, :, :t] = old
                out.append(new)
        return PreallocatedCache.fresh(keys, values, cache.cross_k, cache.cross_v, t)

    @staticmethod
    def fresh(
        self_k: list[Tensor],
        self_v: list[Tensor],
        cross_k: tuple[Tensor, ...],
        cross_v: tuple[Tensor, ...],
        position: int | Tensor,
    ) -> PreallocatedCache:
        """A cache of these keys/values, the next token at `position`, rows in order."""
        device = self_k[0].device
        rows = torch.arange(self_k[0].size(0), device=device)  # (R,)
        return PreallocatedCache(
            list(self_k),
            list(self_v),
            tuple(cross_k),
            tuple(cross_v),
            torch.as_tensor(position, dtype=torch.long, device=device).clone(),
            rows,
            rows.clone(),
            torch.arange(self_k[0].size(2), device=device),
        )

    # Every step the same shapes (`mtkit.search.captured` may capture it), its positions
    # within its capacity, itself within the model's positions
    fixed_shapes = True

    @property
    def capacity(self) -> int:
        """Target positions a row can hold."""
        return self.self_k[0].size(2)

    @property
    def shape(self) -> tuple:
        """What a step on this cache is specific to: rows, capacity, sentences, source
        width, dtype."""
        k, cross = self.self_k[0], self.cross_k[0]
        return ("preallocated", k.size(0), k.size(2), cross.size(0), cross.size(2), k.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in _tensors(self))

    def blank(self) -> PreallocatedCache:
        """A cache of the same shapes, zeros, position 0."""
        return PreallocatedCache.fresh(
            [torch.zeros_like(k) for k in self.self_k],
            [torch.zeros_like(v) for v in self.self_v],
            tuple(torch.zeros_like(k) for k in self.cross_k),
            tuple(torch.zeros_like(v) for v in self.cross_v),
            0,
        )

    def load(self, other: PreallocatedCache) -> None:
        """Copy `other` (of the same shapes) into this cache's tensors, in place."""
        for mine, theirs in zip(_tensors(self), _tensors(other), strict=True):
            mine.copy_(theirs)

    def index_select(self, rows: Tensor, sentences: Tensor | None = None) -> PreallocatedCache:
        """Reorder the rows (in place: this cache, returned), or, where `sentences` (or
        a different number of rows) is given, a new cache of only those."""
        if sentences is None and rows.numel() == self.rows.numel():
            self.rows.copy_(self.rows.index_select(0, rows))
            return self
        rows = self.rows.index_select(0, rows)  # (R',) stored rows

        def pick(ts: tuple[Tensor, ...]) -> tuple[Tensor, ...]:  # copies: the new cache's own
            return tuple(
                t.clone() if sentences is None else t.index_select(0, sentences) for t in ts
            )

        return PreallocatedCache.fresh(
            [k.index_select(0, rows) for k in self.self_k],
            [v.index_select(0, rows) for v in self.self_v],
            pick(self.cross_k),
            pick(self.cross_v),
            self.position,
        )

    def begin(self, rows: int) -> Tensor:
        """Every row's token is at `position`: returned as a () tensor."""
        self._seen = (self._columns <= self.position)[None, None, None, :]  # (1, 1, 1, C)
        return self.position

    def cross(self, layer: int, source_width: int) -> tuple[Tensor, Tensor]:
        return self.cross_k[layer], self.cross_v[layer]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Reorder the layer's stored rows, write k, v (R, H, 1, K) at `position`;
        return all C columns (R, H, C, K) and the mask of those written (1, 1, 1, C)."""
        at = self.position.view(1)
        for stored, new in ((self.self_k[layer], k), (self.self_v[layer], v)):
            stored.copy_(stored.index_select(0, self.rows))
            stored.index_copy_(2, at, new.to(stored.dtype))
        return self.self_k[layer], self.self_v[layer], self._seen

    def advanced(self, new_k: tuple[Tensor, ...], new_v: tuple[Tensor, ...]) -> PreallocatedCache:
        """This cache, one position on, its rows in order (written in place)."""
        self.position += 1
        self.rows.copy_(self._identity)
        return self


def resize(t: Tensor, shape: tuple[int, ...], fill: float = 0) -> Tensor:
    """A tensor of `shape`, like t: what of t fits is kept (its leading corner on every
    axis), the rest is `fill`."""
    out = t.new_full(shape, fill)
    corner = tuple(slice(0, min(have, want)) for have, want in zip(t.shape, shape, strict=True))
    out[corner] = t[corner]
    return out


@dataclass
class SlotCache:
    """The cache of continuous batching (`mtkit.serving.stream`): a fixed number of
    slots, each holding one sentence (one row) or free. A step runs the first B slots (B
    = the tokens given to `decode_step`), which the caller keeps live, and each writes its
    new position at its own column: sentences that joined at different steps each see
    only their own tokens, and none is copied when others join or leave.

    Capacities (slots, target columns C, source positions P) change by `resized`; `move`
    lets live slots fill free ones nearer the front. Which source positions are real is
    the caller's to know: it gives `decode_step` the mask of the live slots."""

    self_k: list[Tensor]  # per layer: (slots, H, C, K)
    self_v: list[Tensor]
    cross_k: list[Tensor]  # per layer: (slots, H, P, K)
    cross_v: list[Tensor]
    positions: Tensor  # (slots,) target tokens each slot holds (stale in a free one)
    # Fixed shapes (for captured steps on a GPU, `mtkit.search.captured`): every step
    # runs all slots over all C columns and all P source positions, free ones too (the
    # caller masks their outputs), nothing read back to the host; a slot's position then
    # stops at C - 1, so that a free one, stepped on, stays within the columns.
    fixed: bool = False
    # Of the step under way (`begin`): its rows (B,) = 0..B-1, their positions (B,), and
    # the columns each may attend to (B, 1, 1, W), its own positions so far among the first W.
    _rows: Tensor | None = field(default=None, repr=False)
    _at: Tensor | None = field(default=None, repr=False)
    _seen: Tensor | None = field(default=None, repr=False)

    @staticmethod
    def empty(
        like: tuple[Tensor, ...],
        slots: int,
        columns: int,
        source_capacity: int,
        fixed: bool = False,
    ) -> SlotCache:
        """Free slots with these capacities, for sources whose keys are `like` (n, H, S,
        K) per layer: in their shapes per head, their dtype (bf16 under CUDA autocast)
        and on their device."""

        def zeros(width: int) -> list[Tensor]:
            return [k.new_zeros(slots, k.size(1), width, k.size(3)) for k in like]

        return SlotCache(
            zeros(columns),
            zeros(columns),
            zeros(source_capacity),
            zeros(source_capacity),
            torch.zeros(slots, dtype=torch.long, device=like[0].device),
            fixed,
        )

    @property
    def fixed_shapes(self) -> bool:
        """Whether its steps have fixed shapes; its positions are then within its columns,
        which its owner keeps within the model's positions."""
        return self.fixed

    @property
    def shape(self) -> tuple:
        """What a step on this cache is specific to: slots, columns, source positions,
        dtype."""
        k = self.self_k[0]
        return ("slots", k.size(0), k.size(2), self.cross_k[0].size(2), k.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in _tensors(self))

    def blank(self) -> SlotCache:
        """Free slots of the same capacities."""
        return SlotCache.empty(
            tuple(self.cross_k), self.slots, self.columns, self.source_capacity, self.fixed
        )

    def load(self, other: SlotCache) -> None:
        """Copy `other` (of the same capacities) into this cache's tensors, in place."""
        for mine, theirs in zip(_tensors(self), _tensors(other), strict=True):
            mine.copy_(theirs)

    @property
    def slots(self) -> int:
        return self.positions.numel()

    @property
    def columns(self) -> int:
        """Target positions a slot can hold."""
        return self.self_k[0].size(2)

    @property
    def source_capacity(self) -> int:
        """Source positions a slot can hold."""
        return self.cross_k[0].size(2)

    def fill(self, slots: Tensor, sources: tuple[tuple[Tensor, ...], tuple[Tensor, ...]]) -> None:
        """New sentences take `slots` (n,): their sources' keys and values (n, H, S', K)
        per layer (`Transformer.cross_kv`), S' <= the source capacity."""
        for mine, theirs in zip((self.cross_k, self.cross_v), sources, strict=True):
            for cache, new in zip(mine, theirs, strict=True):
                cache[slots, :, : new.size(2)] = new
        self.positions[slots] = 0

    def resized(self, slots: int, columns: int, source_capacity: int) -> SlotCache:
        """A copy with these capacities, bigger or smaller: what fits is kept (the caller
        keeps every live slot's sentence inside)."""

        def fit(ts: list[Tensor], width: int) -> list[Tensor]:
            return [resize(t, (slots, t.size(1), width, t.size(3))) for t in ts]

        positions = resize(self.positions, (slots,))
        if self.fixed:  # a free slot's stale position, within the columns
            positions.clamp_(max=columns - 1)
        return SlotCache(
            fit(self.self_k, columns),
            fit(self.self_v, columns),
            fit(self.cross_k, source_capacity),
            fit(self.cross_v, source_capacity),
            positions,
            self.fixed,
        )

    def move(self, old: Tensor, new: Tensor) -> None:
        """Move the sentences in slots `old` (n,) to the free slots `new` (n,)."""
        for t in (*self.self_k, *self.self_v, *self.cross_k, *self.cross_v, self.positions):
            t[new] = t[old]

    def begin(self, rows: int) -> Tensor:
        """The first `rows` slots step, each at its own position: (B,). Each attends to
        its own positions among the first W columns: those up to the furthest slot's, or
        all C in fixed shapes."""
        self._at = self.positions[:rows]  # (B,)
        width = self.columns if self.fixed else int(self._at.max()) + 1
        columns = torch.arange(width, device=self._at.device)  # (W,)
        self._seen = (columns <= self._at[:, None])[:, None, None, :]  # (B, 1, 1, W)
        self._rows = torch.arange(rows, device=self._at.device)  # (B,)
        return self._at

    def cross(self, layer: int, source_width: int) -> tuple[Tensor, Tensor]:
        """The step's slots' source keys/values, cut to the step's source mask (which
        may be narrower than the capacity): (B, H, S, K)."""
        b = self._rows.numel()
        return (
            self.cross_k[layer][:b, :, :source_width],
            self.cross_v[layer][:b, :, :source_width],
        )

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store the new keys/values (B, H, 1, K) at each row's position; return the
        keys/values to attend to (B, H, W, K) and which each row may see."""
        self_k, self_v = self.self_k[layer], self.self_v[layer]
        self_k[self._rows, :, self._at] = k[:, :, 0]
        self_v[self._rows, :, self._at] = v[:, :, 0]
        b, width = self._rows.numel(), self._seen.size(-1)
        return self_k[:b, :, :width], self_v[:b, :, :width], self._seen

    def advanced(self, new_k: tuple[Tensor, ...], new_v: tuple[Tensor, ...]) -> SlotCache:
        """The same cache, its stepped slots one position on (their keys/values are
        already written); in fixed shapes at most at the last column."""
        self.positions[: self._rows.numel()] += 1
        if self.fixed:
            self.positions.clamp_(max=self.columns - 1)
        return self


def _tensors(cache: PreallocatedCache | SlotCache) -> list[Tensor]:
    """Every tensor a fixed-shape cache holds, in one order (`load`)."""
    if isinstance(cache, PreallocatedCache):
        own = [cache.position, cache.rows]
    else:
        own = [cache.positions]
    return [*cache.self_k, *cache.self_v, *cache.cross_k, *cache.cross_v, *own]

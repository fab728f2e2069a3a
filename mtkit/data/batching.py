"""Token-bucketed batches: the sampler that groups pairs, and collate into `Batch` (pure).

A batch's size is counted in padded positions, fairseq-style: B * max(S, T) <= max_tokens,
where S and T include the eos / bos added here. Pairs are sorted along the grid of
(target length, source length), so a batch holds pairs of nearly equal lengths on both
sides and little padding; the order of equal-length pairs and the order of batches are shuffled from
(seed, epoch), so every epoch is different and every run with the same seed is the same.

Batches of few shapes (`BatchShapes`, a run's `train.batch_shapes: classes`): every pair
goes into the class of its padded width w (its longer side with bos/eos, rounded up to
a multiple of 4, at most the model's positions), and every batch of a class is padded to
the same (max_tokens // w, w) on both sides, short batches with empty rows that carry no
loss. On a CPU where bf16 matrix kernels are compiled for each shape (oneDNN on AMX), a
run then meets one shape per 4 positions of its longest pair (a dozen on Multi30k)
instead of hundreds an epoch; batches of one class come in runs of 8, so that the
kernels of one class stay in oneDNN's small cache while it trains on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from mtkit.core.signals import ignore_in_worker
from mtkit.core.vocab import BOS, EOS, PAD


@dataclass(frozen=True)
class Batch:
    """src (B, S) = x + [eos]; tgt_in (B, T) = [bos] + y; tgt_out (B, T) = y + [eos];
    right-padded with PAD (0). With guided alignment, `align` (B, T, S): for each target
    position (tgt_out's), the share of each source position aligned to it (a row sums
    to 1, or to 0 where nothing is aligned)."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    align: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            *(
                t.to(device, non_blocking=non_blocking) if t is not None else None
                for t in (self.src, self.tgt_in, self.tgt_out, self.align)
            )
        )

    def pin_memory(self) -> Batch:
        return Batch(
            *(
                t.pin_memory() if t is not None else None
                for t in (self.src, self.tgt_in, self.tgt_out, self.align)
            )
        )


@dataclass(frozen=True)
class BatchShapes:
    """Batches of few shapes: widths are multiples of `multiple` (but at most `limit`,
    the model's positions), a class's batches have max_tokens // width rows, and come in
    runs of `group` batches of one class."""

    multiple: int = 4
    group: int = 8
    limit: int | None = None

    def width(self, src_length: np.ndarray | int, tgt_length: np.ndarray | int) -> np.ndarray:
        """The padded width of pairs of these stored lengths (without specials)."""
        longest = np.maximum(src_length, tgt_length) + 1  # + eos / bos
        width = -(-longest // self.multiple) * self.multiple
        return width if self.limit is None else np.maximum(np.minimum(width, self.limit), longest)

    @staticmethod
    def rows(width: int, max_tokens: int) -> int:
        return max(max_tokens // int(width), 1)


def collate(pairs: Sequence[tuple[np.ndarray, ...]], shape: tuple[int, int] | None = None) -> Batch:
    """Pairs of id arrays (no specials) -> padded `Batch`. With `shape` (rows, width)
    both sides are padded to width, and rows past the pairs are empty (src = [eos],
    tgt_in = [bos], tgt_out all pad: no loss, no gradient). A pair may carry a third
    array, its alignment links (K, 2) of (source position, target position): the
    batch then holds `align`."""
    n = len(pairs)
    s_len = max(len(p[0]) for p in pairs) + 1
    t_len = max(len(p[1]) for p in pairs) + 1
    if shape is not None:
        if shape[0] < n or shape[1] < max(s_len, t_len):
            raise ValueError(
                f"{n} pairs of width {max(s_len, t_len)} do not fit a batch of shape {shape}"
            )
        n, s_len = shape
        t_len = s_len
    src = torch.full((n, s_len), PAD, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((n, t_len), PAD, dtype=torch.long)  # (B, T)
    tgt_out = torch.full((n, t_len), PAD, dtype=torch.long)  # (B, T)
    if shape is not None:  # the empty rows: one token each side, as a real pair's least
        src[len(pairs) :, 0] = EOS
        tgt_in[len(pairs) :, 0] = BOS
    aligned = len(pairs[0]) == 3
    align = torch.zeros(n, t_len, s_len) if aligned else None  # (B, T, S)
    for b, (x, y, *links) in enumerate(pairs):
        if aligned and len(links[0]):
            at = torch.as_tensor(np.asarray(links[0], dtype=np.int64))  # (K, 2)
            align[b, at[:, 1], at[:, 0]] = 1.0
        x = torch.as_tensor(np.asarray(x, dtype=np.int64))
        y = torch.as_tensor(np.asarray(y, dtype=np.int64))
        src[b, : len(x)] = x
        src[b, len(x)] = EOS
        tgt_in[b, 0] = BOS
        tgt_in[b, 1 : len(y) + 1] = y
        tgt_out[b, : len(y)] = y
        tgt_out[b, len(y)] = EOS
    if align is not None:
        align = align / align.sum(-1, keepdim=True).clamp_min(1.0)  # (B, T, S)
    return Batch(src, tgt_in, tgt_out, align)


def token_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """All batches of one epoch, as arrays of pair indices, in training order.

    Lengths are of the stored ids (without specials). A pair longer than `max_tokens` on
    its own forms a batch of one.
    """
    src_cost = np.asarray(src_lengths, dtype=np.int32) + 1  # + eos (4 bytes a pair)
    tgt_cost = np.asarray(tgt_lengths, dtype=np.int32) + 1  # + bos / eos
    n = len(src_cost)
    rng = np.random.default_rng([seed, epoch])
    order = (rng.permutation(n) if shuffle else np.arange(n)).astype(np.int32)
    # Walk the (target, source) length grid in a snake: target lengths in buckets of two,
    # source length rising in even buckets and falling in odd ones, so the long-source end
    # of one bucket meets the long-source end of the next: fewer padded positions than
    # plain (target, source) order.
    s, t = src_cost[order], tgt_cost[order]
    bucket = t // 2
    snake = np.where(bucket % 2 == 0, s, -s)
    order = order[np.lexsort((t, snake, bucket))]  # stable: keeps ties in shuffled order
    cost = np.maximum(src_cost, tgt_cost)[order]  # a pair's padded width, in batch order
    # Greedy cut: a batch grows while (pairs) * (widest pair so far) fits `max_tokens`.
    # That product never falls as the batch grows, so each cut is found with one
    # vectorized look at the widest the batch could be: max_tokens // its first width.
    batches, start = [], 0
    while start < n:
        window = cost[start : start + max_tokens // max(int(cost[start]), 1) + 1]
        fits = np.arange(1, len(window) + 1) * np.maximum.accumulate(window) <= max_tokens
        fits[0] = True  # a pair wider than max_tokens forms a batch of one
        end = start + (int(np.argmin(fits)) if not fits.all() else len(window))
        batches.append(order[start:end])
        start = end
    if shuffle:
        batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches


def shaped_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shapes: BatchShapes,
    shuffle: bool = True,
    runs_of: int | None = None,
) -> list[np.ndarray]:
    """All batches of one epoch in few shapes (`BatchShapes`), as arrays of pair indices,
    in training order: each width class's pairs in (seed, epoch) order, cut every
    max_tokens // width pairs (the last batch of a class may be short), the batches in
    runs of `runs_of` (default `shapes.group`) of one class, the runs shuffled."""
    width = shapes.width(
        np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    )
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(width)) if shuffle else np.arange(len(width))
    order = order[np.argsort(width[order], kind="stable")]  # by class, shuffled within
    runs, start = [], 0
    run = runs_of or shapes.group
    for w, count in zip(*np.unique(width, return_counts=True), strict=True):
        pairs, rows = order[start : start + count], shapes.rows(w, max_tokens)
        batches = [pairs[i : i + rows] for i in range(0, count, rows)]
        runs += [batches[i : i + run] for i in range(0, len(batches), run)]
        start += count
    if shuffle:
        runs = [runs[k] for k in rng.permutation(len(runs))]
    return [batch for r in runs for batch in r]


def shaped_collate(
    pairs: Sequence[tuple[np.ndarray, ...]], shapes: BatchShapes, max_tokens: int
) -> Batch:
    """`collate` into the shape of the pairs' width class."""
    width = int(shapes.width(max(len(p[0]) for p in pairs), max(len(p[1]) for p in pairs)))
    return collate(pairs, (shapes.rows(width, max_tokens), width))


def draw_pairs(draws: Sequence[tuple[np.ndarray, int]], seed: int, epoch: int) -> np.ndarray:
    """One epoch's pairs under temperature sampling: from each (indices, count), every
    index count // len times, and a draw without replacement of the rest, seeded by
    (seed, epoch) so that a resumed run draws the same."""
    rng = np.random.default_rng([seed, epoch, 7])
    out = []
    for indices, count in draws:
        whole, rest = divmod(count, len(indices))
        out += [indices] * whole + [rng.choice(indices, rest, replace=False)]
    return np.sort(np.concatenate(out)).astype(np.int64)


class TokenBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches of one epoch, optionally from batch k (exact resume).

    With `world_size` ranks every rank takes every world_size-th batch of the same
    epoch order; the tail is cut so that all ranks run the same number of steps. With
    `draws` (a multilingual run's `data.temperature`), each epoch batches its own draw of
    pairs from each direction (`draw_pairs`). With `shapes`, the batches come in few
    shapes (`shaped_batches`, in runs of group x world_size batches of a class, so that
    each rank gets about `group` in a row) and `collate_fn` pads them to their class's
    shape.
    """

    def __init__(
        self,
        src_lengths: np.ndarray,
        tgt_lengths: np.ndarray,
        max_tokens: int,
        seed: int = 1,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        draws: Sequence[tuple[np.ndarray, int]] = (),
        shapes: BatchShapes | None = None,
    ):
        self.shapes = shapes
        self.draws = list(draws)  # (pair indices of a direction, pairs an epoch draws)
        self._sizes: dict[int, int] = {}  # epoch_size of epochs other than the current
        self.src_lengths = np.asarray(src_lengths)
        self.tgt_lengths = np.asarray(tgt_lengths)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start_batch = 0
        self._batches = self._make(0)

    @property
    def collate_fn(self) -> Callable[[Sequence[tuple[np.ndarray, np.ndarray]]], Batch]:
        if self.shapes is None:
            return collate
        return partial(shaped_collate, shapes=self.shapes, max_tokens=self.max_tokens)

    def _batch(
        self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, epoch: int
    ) -> list[np.ndarray]:
        if self.shapes is None:
            return token_batches(
                src_lengths, tgt_lengths, self.max_tokens, self.seed, epoch, self.shuffle
            )
        return shaped_batches(
            src_lengths,
            tgt_lengths,
            self.max_tokens,
            self.seed,
            epoch,
            self.shapes,
            self.shuffle,
            runs_of=self.shapes.group * self.world_size,
        )

    def _make(self, epoch: int) -> list[np.ndarray]:
        if self.draws:  # temperature sampling: this epoch's draw of each direction
            chosen = draw_pairs(self.draws, self.seed, epoch)
            every = [
                chosen[b]
                for b in self._batch(self.src_lengths[chosen], self.tgt_lengths[chosen], epoch)
            ]
        else:
            every = self._batch(self.src_lengths, self.tgt_lengths, epoch)
        per_rank = len(every) // self.world_size
        if per_rank == 0:
            raise ValueError(f"{len(every)} batches cannot feed {self.world_size} ranks")
        return every[self.rank : per_rank * self.world_size : self.world_size]

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch (its shuffle) and the batch to start from."""
        if epoch != self.epoch:
            self._batches = self._make(epoch)
        self.epoch = epoch
        self.start_batch = start_batch

    def epoch_size(self, epoch: int) -> int:
        """Batches this rank runs in `epoch` (all of them): the same every epoch, except
        under temperature sampling, where each epoch draws other pairs."""
        if epoch == self.epoch or not self.draws:
            return len(self._batches)
        if epoch not in self._sizes:
            self._sizes[epoch] = len(self._make(epoch))
        return self._sizes[epoch]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._batches[self.start_batch :]:
            yield batch.tolist()

    def __len__(self) -> int:
        """Batches this rank runs in the current epoch, from `start_batch` on."""
        return max(len(self._batches) - self.start_batch, 0)


def make_loader(
    dataset,
    sampler: TokenBatchSampler,
    workers: int = 1,
    pin_memory: bool = False,
    generator: torch.Generator | None = None,
) -> DataLoader:
    """A DataLoader over `dataset` (a `ShardDataset`) in the sampler's batches. Pass a
    `generator` to keep the loader from drawing on the global RNG (exact resume). Its
    workers ignore stop signals (`mtkit.core.signals`): start them with
    `held_while_starting_workers`, i.e. create the loader's iterator inside it."""
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=sampler.collate_fn,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        generator=generator,
        worker_init_fn=ignore_in_worker,
    )

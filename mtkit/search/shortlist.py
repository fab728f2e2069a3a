"""Lexical shortlists: the target pieces a batch may output, from its source pieces.

A shortlist (Schwenk et al. 2007; Marian's `--shortlist`, the Bergamot students) holds, for
each source piece, the k target pieces most often seen with it in the training pairs, and
the most frequent target pieces, which every batch may output. A batch's output
vocabulary is the union over its source pieces: a few hundred of the 8,000 pieces, so the
output projection, the largest matrix product of a small decoder's step, computes a few
hundred rows of logits instead of all. The other pieces get -inf: the search is the same
search over fewer candidates (its outputs can differ from the full search's only where
the full search would have chosen a piece outside the list).

`build_shortlist` counts co-occurrences (pure numpy); `Shortlisted` is a step model that
projects onto the batch's pieces only. A shortlist is checked against the vocabularies
where it is read (`mtkit.core.checkpoint.check_shortlist`: when training starts, when a
checkpoint is loaded), never trusted as found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtkit.core.vocab import BOS, EOS, PAD, UNK

FREQUENT = 100  # target pieces every batch may output
PER_SOURCE = 50  # target pieces per source piece


@dataclass(frozen=True)
class Shortlist:
    """`frequent` (F,): target ids always allowed; `table` (V_src, k): each source id's
    k best target ids, padded with -1."""

    frequent: Tensor
    table: Tensor

    def as_entry(self) -> dict[str, Tensor]:
        """The checkpoint entry ("shortlist"); `mtkit distill` adds the vocabulary sizes
        it was made for (`checkpoint.VOCAB_SIZES`)."""
        return {"frequent": self.frequent, "table": self.table}

    @classmethod
    def of_entry(cls, entry: dict[str, Tensor]) -> Shortlist:
        """The shortlist of a checkpoint entry that `checkpoint.check_shortlist` passed
        for the model's vocabularies: ids outside them would index past its output
        layer."""
        return cls(entry["frequent"].long(), entry["table"].long())

    def allowed(self, src: Tensor) -> Tensor:
        """src (B, S) source ids -> (A,) the sorted target ids the batch may output: the
        frequent ones, each source piece's, and the special ones (eos, unk); never pad
        or bos, which are no outputs."""
        table = self.table.to(src.device)
        rows = table[src[src < table.size(0)]].flatten()  # (B*S*k,)
        specials = torch.tensor([UNK, EOS], device=src.device)
        ids = torch.unique(torch.cat([self.frequent.to(src.device), rows[rows >= 0], specials]))
        return ids[(ids != PAD) & (ids != BOS)]  # sorted


def build_shortlist(
    src: list[np.ndarray],
    tgt: list[np.ndarray],
    src_vocab_size: int,
    tgt_vocab_size: int,
    per_source: int = PER_SOURCE,
    frequent: int = FREQUENT,
) -> Shortlist:
    """From aligned pairs of id arrays (the student's training pairs): for each source
    piece s, the `per_source` target pieces t of highest p(t | s) = (pairs holding both)
    / (pairs holding s), leaving out the `frequent` most frequent target pieces, which
    every batch gets anyway. Counts are per pair (a piece counted once per sentence)."""
    codes, target_counts = [], np.zeros(tgt_vocab_size, dtype=np.int64)
    source_counts = np.zeros(src_vocab_size, dtype=np.int64)
    for s, t in zip(src, tgt, strict=True):
        s, t = np.unique(s), np.unique(t)
        source_counts[s] += 1
        target_counts[t] += 1
        codes.append((s[:, None].astype(np.int64) * tgt_vocab_size + t[None, :]).ravel())
    top = np.argsort(-target_counts, kind="stable")[:frequent]
    top = top[target_counts[top] > 0]
    specials = np.array([PAD, BOS])  # never outputs
    pair, count = np.unique(
        np.concatenate(codes) if codes else np.zeros(0, np.int64), return_counts=True
    )
    s_of, t_of = pair // tgt_vocab_size, pair % tgt_vocab_size
    keep = ~np.isin(t_of, np.concatenate([top, specials]))
    s_of, t_of, count = s_of[keep], t_of[keep], count[keep]
    prob = count / source_counts[s_of]
    order = np.lexsort((t_of, -prob, s_of))  # by source, best first (ties: lower id)
    s_of, t_of = s_of[order], t_of[order]
    starts = np.searchsorted(s_of, np.arange(src_vocab_size))
    rank = np.arange(len(s_of)) - starts[s_of]
    within = rank < per_source
    table = np.full((src_vocab_size, per_source), -1, dtype=np.int64)
    table[s_of[within], rank[within]] = t_of[within]
    return Shortlist(torch.from_numpy(np.sort(top)), torch.from_numpy(table))


class Shortlisted:
    """A `Transformer` as a step model whose output projection covers only `allowed`
    (A,) target ids. The projection's rows are taken once per batch (an int8 model's
    int8 rows), not per step. Its logits are (rows, V), -inf outside `allowed`, or with
    `compact` (rows, A) (`beam.output_columns`: `columns` says which token each column
    is): the search's log-softmax and top-k then read A columns, not V (greedy and beam
    search without prefixes, n-gram bans or constraints, which name tokens)."""

    def __init__(self, model: Any, allowed: Tensor, compact: bool = False):
        self.model = model
        self.allowed = allowed  # (A,)
        self.project = model.output_rows(allowed)  # (rows, D) -> (rows, A)
        self.columns = allowed if compact else None
        if compact:
            self.eos_column = int(torch.searchsorted(allowed, EOS))

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any
    ) -> tuple[Tensor, Any]:
        hidden, cache = self.model.decode_hidden(token, memory, src_mask, cache)  # (rows, D)
        few = self.project(hidden)  # (rows, A)
        if self.columns is not None:
            return few, cache
        logits = few.new_full((few.size(0), self.model.vocab_size), float("-inf"))  # (rows, V)
        logits[:, self.allowed] = few
        return logits, cache

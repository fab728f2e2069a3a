from __future__ import annotations

import torch
from scripted import A, B, C, Scripted

from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS, PAD
from mtkit.search.sampling import sample_search

SRC = torch.tensor([[A, B, C, EOS]])
FOUR = SearchOptions(beam=4)  # four draws per sentence


FIRST = {(): {A: 0.5, B: 0.3, C: 0.2}}  # then eos


def first_tokens(samples: int, seed: int = 1, **kw) -> list[int]:
    hyps = sample_search(Scripted(FIRST), SRC, SearchOptions(beam=samples, **kw), seeds=[seed])[0]
    return [h.tokens[0] for h in hyps]


def test_sampling_follows_the_model_distribution():
    drawn = first_tokens(3000)
    counts = [drawn.count(t) for t in (A, B, C)]
    expected = [3000 * p for p in (0.5, 0.3, 0.2)]
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    assert sum(counts) == 3000 and chi2 < 13.8  # chi-square, 2 degrees of freedom, p=0.001


def test_top_k_top_p_and_temperature_never_emit_an_excluded_token():
    assert set(first_tokens(500, topk=1)) == {A}
    assert set(first_tokens(500, topk=2)) == {A, B}
    assert set(first_tokens(500, topp=0.5)) == {A}  # A alone reaches 0.5
    assert set(first_tokens(500, topp=0.6)) == {A, B}
    assert set(first_tokens(500, temperature=0.01)) == {A}


def test_sampling_is_seeded_and_batched_equals_one_by_one():
    model = Scripted(
        {
            (): {A: 0.4, B: 0.3, C: 0.3},
            (A,): {B: 0.5, C: 0.5},
            (B,): {A: 0.5, EOS: 0.5},
            (C,): {A: 0.5, EOS: 0.5},
        }
    )
    src = torch.tensor([[A, B, C, EOS], [A, EOS, PAD, PAD], [B, C, EOS, PAD]])
    together = sample_search(model, src, FOUR, seeds=[7, 8, 9])
    # The first step runs one row per sentence; then each sample has its own row, which
    # leaves the batch when the sample ends.
    rows = model.rows[1:]
    assert model.rows[0] == 3 and rows[0] == 12 and rows == sorted(rows, reverse=True)
    alone = [
        sample_search(model, src[i : i + 1, :], FOUR, seeds=[s])[0] for i, s in enumerate((7, 8, 9))
    ]
    assert [[h.tokens for h in x] for x in together] == [[h.tokens for h in x] for x in alone]
    again = sample_search(model, src, FOUR, seeds=[7, 8, 9])
    assert [[h.tokens for h in x] for x in again] == [[h.tokens for h in x] for x in together]
    other = sample_search(model, src, FOUR, seeds=[1, 2, 3])
    assert [[h.tokens for h in x] for x in other] != [[h.tokens for h in x] for x in together]

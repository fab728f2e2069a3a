from __future__ import annotations

import numpy as np
import pytest

from mtkit.data.batching import (
    Batch,
    TokenBatchSampler,
    collate,
    make_loader,
    padding_share,
    token_batches,
)
from mtkit.vocab import BOS, EOS, PAD

RNG = np.random.default_rng(0)
SRC = RNG.integers(1, 40, size=3000)
TGT = np.clip(SRC + RNG.integers(-5, 6, size=3000), 1, None)


def test_collate_pads_right_and_shifts_target():
    batch = collate([(np.array([7, 8, 9]), np.array([10, 11])), (np.array([5]), np.array([12]))])
    assert batch.src.tolist() == [[7, 8, 9, EOS], [5, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 10, 11], [BOS, 12, PAD]]
    assert batch.tgt_out.tolist() == [[10, 11, EOS], [12, EOS, PAD]]
    assert int((batch.tgt_out != PAD).sum()) == 5  # the target tokens that count in the loss
    assert isinstance(batch, Batch) and batch.src.dtype == batch.tgt_in.dtype


def test_batches_respect_the_token_budget_and_cover_every_pair_once():
    batches = token_batches(SRC, TGT, max_tokens=400, seed=1, epoch=0)
    for b in batches:
        assert len(b) * max(SRC[b].max() + 1, TGT[b].max() + 1) <= 400
    assert sorted(np.concatenate(batches).tolist()) == list(range(3000))


def test_a_pair_over_the_budget_forms_a_batch_of_one():
    batches = token_batches(np.array([3, 500, 4]), np.array([3, 2, 4]), 100, seed=1, epoch=0)
    assert [1] in [b.tolist() for b in batches]


def test_batches_are_deterministic_per_seed_and_epoch_and_differ_across_epochs():
    a = token_batches(SRC, TGT, 400, seed=3, epoch=1)
    b = token_batches(SRC, TGT, 400, seed=3, epoch=1)
    c = token_batches(SRC, TGT, 400, seed=3, epoch=2)
    d = token_batches(SRC, TGT, 400, seed=4, epoch=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    assert [x.tolist() for x in a] != [x.tolist() for x in d]


def test_length_bucketing_pads_far_less_than_sentence_count_batches():
    ours = padding_share(token_batches(SRC, TGT, 1000, seed=1, epoch=0), SRC, TGT)
    order = np.random.default_rng(1).permutation(3000)
    naive = padding_share([order[i:i + 32] for i in range(0, 3000, 32)], SRC, TGT)
    assert ours < 0.08 and naive > 3 * ours


def test_sampler_resumes_at_batch_k_of_an_epoch():
    sampler = TokenBatchSampler(SRC, TGT, 400, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start_batch=5)
    assert list(sampler) == full[5:] and len(sampler) == len(full) - 5
    fresh = TokenBatchSampler(SRC, TGT, 400, seed=1)
    fresh.set_epoch(2, start_batch=5)
    assert list(fresh) == full[5:]


def test_ranks_get_disjoint_equal_shares_of_the_same_epoch():
    every = token_batches(SRC, TGT, 400, seed=1, epoch=0)
    shares = [list(TokenBatchSampler(SRC, TGT, 400, seed=1, rank=r, world_size=3))
              for r in range(3)]
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) == len(every) // 3
    flat = [tuple(b) for s in shares for b in s]
    assert len(set(flat)) == len(flat)
    assert set(flat) <= {tuple(b.tolist()) for b in every}
    with pytest.raises(ValueError, match=r"cannot feed 4 ranks"):
        TokenBatchSampler(SRC[:3], TGT[:3], 4000, world_size=4)


class ListDataset:
    def __init__(self, n: int):
        self.items = [(np.arange(4, 4 + SRC[i]), np.arange(4, 4 + TGT[i])) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_yields_the_sampler_batches_in_order(workers):
    sampler = TokenBatchSampler(SRC[:300], TGT[:300], 400, seed=1)
    sampler.set_epoch(1, start_batch=2)
    expected = list(sampler)
    batches = list(make_loader(ListDataset(300), sampler, workers=workers))
    assert len(batches) == len(expected)
    for batch, idx in zip(batches, expected):
        assert batch.src.shape == (len(idx), SRC[idx].max() + 1)
        assert batch.tgt_out.shape == (len(idx), TGT[idx].max() + 1)


def test_temperature_draws_each_direction_its_count_each_epoch():
    """Three directions of 2,000, 800 and 200 pairs; at temperature 5 an epoch draws
    1,218 / 1,014 / 768 (`languages.epoch_counts`): the big one without replacement, the
    small ones every pair and more."""
    from mtkit.data.batching import draw_pairs
    from mtkit.languages import epoch_counts

    groups = {"a": np.arange(0, 2000), "b": np.arange(2000, 2800), "c": np.arange(2800, 3000)}
    counts = epoch_counts({d: len(ix) for d, ix in groups.items()}, 5.0)
    assert counts == {"a": 1218, "b": 1014, "c": 768}
    draws = [(ix, counts[d]) for d, ix in groups.items()]
    sampler = TokenBatchSampler(SRC, TGT, 400, seed=1, draws=draws)
    seen = {}
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        pairs = np.concatenate([np.array(b) for b in sampler])
        assert len(sampler) == sampler.epoch_size(epoch)
        per = {d: int(np.isin(pairs, ix).sum()) for d, ix in groups.items()}
        assert per == counts  # every batch of the epoch, counted by direction
        a = pairs[pairs < 2000]
        assert len(np.unique(a)) == len(a)  # downsampled: no pair twice
        assert set(range(2800, 3000)) <= set(pairs.tolist())  # upsampled: every pair
        seen[epoch] = np.sort(pairs)
    assert not np.array_equal(seen[0], seen[1])  # each epoch its own draw...
    assert np.array_equal(draw_pairs(draws, 1, 1), seen[1])  # ...the same on a resume
    assert sampler.epoch_size(0) > 0 and len(TokenBatchSampler(SRC, TGT, 400).draws) == 0

from __future__ import annotations

import numpy as np
import pytest

from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.data.batching import (
    Batch,
    BatchShapes,
    TokenBatchSampler,
    collate,
    make_loader,
    shaped_batches,
    shaped_collate,
    token_batches,
)

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


def padding_share(batches, src_lengths, tgt_lengths) -> float:
    """Share of padded positions over all batches, counting source and target tensors."""
    padded = real = 0
    for b in batches:
        s, t = src_lengths[b] + 1, tgt_lengths[b] + 1
        padded += len(b) * (s.max() + t.max())
        real += s.sum() + t.sum()
    return float(1 - real / padded)


def test_length_bucketing_pads_far_less_than_sentence_count_batches():
    ours = padding_share(token_batches(SRC, TGT, 1000, seed=1, epoch=0), SRC, TGT)
    order = np.random.default_rng(1).permutation(3000)
    naive = padding_share([order[i : i + 32] for i in range(0, 3000, 32)], SRC, TGT)
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
    shares = [
        list(TokenBatchSampler(SRC, TGT, 400, seed=1, rank=r, world_size=3)) for r in range(3)
    ]
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
    from mtkit.core.languages import epoch_counts
    from mtkit.data.batching import draw_pairs

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


SHAPES = BatchShapes(multiple=4, group=3)


def runs_of_classes(widths: list[int]) -> list[tuple[int, int]]:
    """(width, how many batches in a row) along an epoch."""
    runs: list[tuple[int, int]] = []
    for w in widths:
        if runs and runs[-1][0] == w:
            runs[-1] = (w, runs[-1][1] + 1)
        else:
            runs.append((w, 1))
    return runs


def test_shaped_batches_cover_every_pair_once_in_runs_of_one_width_class():
    batches = shaped_batches(SRC, TGT, 400, seed=1, epoch=0, shapes=SHAPES)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(SRC)))
    widths = []
    for b in batches:
        w = SHAPES.width(SRC[b], TGT[b])
        assert len(set(w.tolist())) == 1 and w[0] % 4 == 0  # one class a batch
        assert w[0] >= max(SRC[b].max(), TGT[b].max()) + 1 and len(b) <= 400 // w[0]
        widths.append(int(w[0]))
    assert sorted(set(widths)) == list(range(4, 52, 4))  # 1..44 subwords + eos/bos
    # Full batches but one a class at most.
    assert sum(len(b) < 400 // w for b, w in zip(batches, widths)) <= len(set(widths))
    # A class's batches come in runs of 3 (its last run shorter), shuffled: two of its
    # runs may meet, but only the run holding its short remainder is not a multiple of 3.
    runs = runs_of_classes(widths)
    for w in set(widths):
        mine = [n for v, n in runs if v == w]
        assert sum(mine) == widths.count(w)
        assert sum(n % 3 != 0 for n in mine) == (widths.count(w) % 3 != 0)
    assert len(runs) < len(batches) / 2
    again = shaped_batches(SRC, TGT, 400, seed=1, epoch=0, shapes=SHAPES)
    other = shaped_batches(SRC, TGT, 400, seed=1, epoch=1, shapes=SHAPES)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other))
    in_order = shaped_batches(SRC, TGT, 400, seed=1, epoch=0, shapes=SHAPES, shuffle=False)
    assert [
        w for w, _ in runs_of_classes([int(SHAPES.width(SRC[b], TGT[b])[0]) for b in in_order])
    ] == sorted(set(widths))


def test_shaped_collate_pads_both_sides_to_the_class_and_adds_empty_rows():
    pairs = [(np.array([7, 8, 9, 10, 11]), np.array([12, 13])), (np.array([5]), np.array([6]))]
    batch = shaped_collate(pairs, BatchShapes(multiple=4), max_tokens=33)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (4, 8)  # 33 // 8
    exact = collate(pairs)
    assert batch.src[:2, :6].tolist() == exact.src.tolist()
    assert batch.tgt_out[:2, :3].tolist() == exact.tgt_out.tolist()
    assert batch.src[:2, 6:].eq(PAD).all() and batch.tgt_in[:2, 3:].eq(PAD).all()
    assert batch.src[2:].tolist() == [[EOS] + [PAD] * 7] * 2
    assert batch.tgt_in[2:].tolist() == [[BOS] + [PAD] * 7] * 2
    assert batch.tgt_out[2:].eq(PAD).all()  # empty rows carry no loss
    with pytest.raises(ValueError, match="2 pairs of width 6 do not fit a batch of shape"):
        collate(pairs, (1, 8))


def test_a_shaped_batch_has_the_loss_and_gradients_of_the_exact_one():
    import torch

    from mtkit.core.config import ModelConfig
    from mtkit.model.transformer import build_model
    from mtkit.training.loop import batch_loss

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32, dropout=0.0
        ),
        40,
        40,
    )
    rng = np.random.default_rng(1)
    pairs = [(rng.integers(4, 40, n), rng.integers(4, 40, m)) for n, m in [(5, 7), (3, 2), (6, 6)]]

    def loss_and_grads(batch):
        model.zero_grad()
        out = batch_loss(model, batch, 0.1)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    exact, exact_grads = loss_and_grads(collate(pairs))
    shaped, shaped_grads = loss_and_grads(shaped_collate(pairs, BatchShapes(), 100))
    assert shaped.tokens == exact.tokens == 18
    assert shaped.loss.item() == pytest.approx(exact.loss.item(), rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(exact_grads, shaped_grads))


def test_ranks_get_runs_of_a_class_and_the_loader_pads_to_it():
    ranks = [
        TokenBatchSampler(SRC, TGT, 400, seed=2, rank=r, world_size=2, shapes=SHAPES)
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1])
    every = shaped_batches(SRC, TGT, 400, seed=2, epoch=0, shapes=SHAPES, runs_of=6)
    assert [b.tolist() for b in ranks[0]._batches] == [b.tolist() for b in every[0::2]][
        : len(ranks[0])
    ]
    # Runs of 3 x 2 ranks: each rank changes class at most once a run, far less often
    # than token batches of shuffled lengths do.
    widths = [int(SHAPES.width(SRC[b], TGT[b])[0]) for b in ranks[1]._batches]
    assert len(runs_of_classes(widths)) - 1 <= len(every) / 6 + len(set(widths))
    sampler = TokenBatchSampler(SRC[:300], TGT[:300], 400, seed=1, shapes=SHAPES)
    for batch, idx in zip(
        make_loader(ListDataset(300), sampler, workers=0), list(sampler), strict=True
    ):
        w = int(SHAPES.width(SRC[idx].max(), TGT[idx].max()))
        assert batch.src.shape == batch.tgt_out.shape == (400 // w, w)
        assert int((batch.tgt_out != PAD).sum()) == int((TGT[idx] + 1).sum())


def test_widths_never_pass_the_model_positions():
    """A class rounded up past model.max_positions would crash the model mid-run: the
    widest class is cut to the positions (never below the pair's own width)."""
    capped = BatchShapes(multiple=4, limit=10)
    assert BatchShapes(multiple=4).width(9, 3) == 12
    assert capped.width(9, 3) == 10 and capped.width(6, 2) == 8 and capped.width(10, 2) == 11
    batch = shaped_collate([(np.arange(4, 13), np.arange(4, 7))], capped, max_tokens=40)
    assert batch.src.shape == batch.tgt_in.shape == (4, 10)

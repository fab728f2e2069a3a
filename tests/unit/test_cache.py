from __future__ import annotations

import pytest
import torch
from scripted import batch, tiny

from mtkit.model.cache import BeamCache, SlotCache, resize
from mtkit.model.transformer import build_model

V = 40


def test_state_index_select_reorders_rows():
    model = build_model(tiny(), V, V).eval()
    src, tgt = batch()
    memory, mask = model.encode(src)
    _, state = model.decode_step(tgt[:, 0], memory, mask)
    order = torch.tensor([2, 0, 0])
    picked = state.index_select(order, order)
    assert torch.equal(picked.layer(1)[0], state.self_k[1][order])
    assert picked.self_k[1] is state.self_k[1]  # the reorder is recorded, not copied
    twice = picked.index_select(torch.tensor([1, 2]))  # composed: rows 0, 0 of `state`
    assert torch.equal(twice.layer(0)[1], state.self_v[0][torch.tensor([0, 0])])
    with torch.no_grad():  # as search runs: one copy into the new keys/values (`out=`)
        rows = torch.tensor([0, 0])  # `state`'s row and sentence 0, twice
        cache = twice.index_select(torch.arange(2), torch.tensor([1, 2]))  # `picked`'s 1, 2
        logits, after = model.decode_step(tgt[rows, 1], None, mask[rows], cache)
        reference, made = model.decode_step(
            tgt[rows, 1],
            None,
            mask[rows],
            BeamCache(
                *(
                    tuple(t[rows] for t in ts)
                    for ts in (state.self_k, state.self_v, state.cross_k, state.cross_v)
                )
            ),
        )
    assert torch.allclose(logits, reference, atol=1e-6)
    assert after.rows is None and torch.equal(after.self_k[0], made.self_k[0])
    assert torch.equal(picked.cross_v[0], state.cross_v[0][order])
    logits, _ = model.decode_step(tgt[order, 1], memory[order], mask[order], picked)
    reference, _ = model.decode_step(tgt[:, 1], memory, mask, state)
    assert torch.allclose(logits, reference[order], atol=1e-6)
    beams = state.index_select(order)  # rows reordered; the sources stay one per sentence
    assert beams.cross_v[0] is state.cross_v[0]


def test_the_first_beam_cache_holds_the_sources_only():
    model = build_model(tiny(), V, V).eval()
    src, tgt = batch()
    memory, mask = model.encode(src)
    keys, values = model.cross_kv(memory)  # split into heads: views, not contiguous
    assert not keys[0].is_contiguous()
    first = BeamCache.first(keys, values)
    assert first.length == 0 and first.begin(3) == 0 and first.self_k == []
    # held contiguous, as the attention's products read them (no copy at every step)
    assert all(t.is_contiguous() for t in (*first.cross_k, *first.cross_v))
    assert all(torch.equal(a, b) for a, b in zip(first.cross_k + first.cross_v, keys + values))
    given, _ = model.decode_step(tgt[:, 0], None, mask, first)
    made, cache = model.decode_step(tgt[:, 0], memory, mask)  # cache None: made of memory
    assert torch.equal(given, made) and cache.length == 1


def slot_steps(model, src, tgt, joins: list[int], slots: list[int], capacity=(5, 9, 11)):
    """Teacher-forced steps through a `SlotCache` of `capacity` (slots, columns, source
    positions): sentence i takes slot `slots[i]` before step `joins[i]`, and each step
    runs the first B slots, all filled (one whose sentence is over takes any token).
    Returns each sentence's logits per step, (T, V)."""
    memory, mask = model.encode(src)
    cache = model.slot_cache(model.cross_kv(memory[:1]), *capacity)
    src_mask = torch.zeros(capacity[0], capacity[2], dtype=torch.bool)
    out: dict[int, list[torch.Tensor]] = {i: [] for i in range(src.size(0))}
    where = {}  # sentence -> slot
    for step in range(max(joins) + tgt.size(1)):
        for i, (join, slot) in enumerate(zip(joins, slots)):
            if join == step:
                cache.fill(torch.tensor([slot]), model.cross_kv(memory[i : i + 1]))
                src_mask[slot, : mask.size(1)] = mask[i]
                where[i] = slot
        b = len(where)
        assert sorted(where.values()) == list(range(b))  # the first B slots, all filled
        token = torch.full((b,), 4)
        for i, s in where.items():
            if step - joins[i] < tgt.size(1):
                token[s] = tgt[i, step - joins[i]]
        logits, cache = model.decode_step(token, None, src_mask[:b], cache)  # (B, V)
        for i, s in where.items():
            if step - joins[i] < tgt.size(1):
                out[i].append(logits[s])
    return {i: torch.stack(rows) for i, rows in out.items()}


@pytest.mark.parametrize("kw", [{}, {"norm": "pre", "positions": "learned"}])
def test_a_beam_cache_and_a_slot_cache_give_the_same_logits(kw):
    """The same sentences, stepped through a `BeamCache` together and through a
    `SlotCache` in other slots, joining at different steps (each slot at its own
    position, wider than its source): the same logits step by step."""
    torch.manual_seed(0)
    model = build_model(tiny(**kw), V, V).eval()
    src, tgt = batch(1)
    memory, mask = model.encode(src)
    beam, cache = [], None
    for t in range(tgt.size(1)):
        logits, cache = model.decode_step(tgt[:, t], memory, mask, cache)
        beam.append(logits)
    beam = torch.stack(beam, dim=1)  # (3, T, V)
    with torch.no_grad():
        slotted = slot_steps(model, src, tgt, joins=[0, 2, 2], slots=[0, 2, 1])
    for i in range(3):
        assert torch.allclose(slotted[i], beam[i], atol=1e-5), i


def test_resize_keeps_what_fits():
    t = torch.arange(6).view(2, 3)
    grown = resize(t, (3, 5), -1)
    assert torch.equal(grown[:2, :3], t) and (grown[2] == -1).all() and (grown[:, 3:] == -1).all()
    assert torch.equal(resize(t, (1, 2)), t[:1, :2])
    assert torch.equal(resize(t, (3, 2), 7), torch.tensor([[0, 1], [3, 4], [7, 7]]))
    flags = resize(torch.ones(2, 2, dtype=torch.bool), (2, 3), False)
    assert flags.dtype == torch.bool and flags.tolist() == [[True, True, False]] * 2


def test_a_resized_or_moved_slot_cache_steps_as_before():
    """Slot capacities change (bigger, then smaller, but still holding the live
    sentence) and a sentence moves to another slot: its next logits do not change."""
    torch.manual_seed(0)
    model = build_model(tiny(), V, V).eval()
    src, tgt = batch()
    memory, mask = model.encode(src[:1])
    sources = model.cross_kv(memory)  # (1, H, S, K) per layer
    cache = model.slot_cache(sources, 2, 8, 7)
    assert (cache.slots, cache.columns, cache.source_capacity) == (2, 8, 7)
    cache.fill(torch.tensor([0]), sources)
    for t in range(3):
        _, cache = model.decode_step(tgt[:1, t], None, mask, cache)
    reference, _ = model.decode_step(
        tgt[:1, 3], None, mask, cache.resized(2, 8, 7)
    )  # a copy: `cache` stays
    grown = cache.resized(4, 12, 9)
    assert (grown.slots, grown.columns, grown.source_capacity) == (4, 12, 9)
    shrunk = grown.resized(1, 4, 7)
    assert shrunk.positions.tolist() == [3]
    logits, _ = model.decode_step(tgt[:1, 3], None, mask, shrunk)
    assert torch.equal(logits, reference)
    moved = grown.resized(4, 12, 9)
    moved.move(torch.tensor([0]), torch.tensor([1]))  # slot 0 keeps a stale copy
    logits, _ = model.decode_step(tgt[[0, 0], 3], None, mask.expand(2, -1), moved)
    assert torch.allclose(logits[1], reference[0], atol=1e-6)
    assert moved.positions[:2].tolist() == [4, 4] and isinstance(moved, SlotCache)


def test_a_step_spends_its_cache_and_lets_go_of_the_old_keys_and_values():
    """Under search (no gradients) a step frees each layer's old keys/values while the
    caller still holds the cache it passed: the search holds its caches about once.
    The spent cache refuses a second step (one line, not wrong logits); a copy made by
    `index_select` before the step is not spent."""
    import weakref

    model = build_model(tiny(), V, V).eval()
    src, tgt = batch()
    memory, mask = model.encode(src)
    with torch.no_grad():
        _, cache = model.decode_step(tgt[:, 0], memory, mask)
        kept = cache.index_select(torch.arange(3))  # its own lists of the same tensors
        _, cache = model.decode_step(tgt[:, 1], None, mask, cache)
        old = [weakref.ref(t) for t in (*cache.self_k, *cache.self_v)]
        ahead = cache.index_select(torch.arange(3))
        logits, after = model.decode_step(tgt[:, 2], None, mask, cache)
        assert all(r() is not None for r in old)  # `ahead` still holds them
        del ahead
        assert all(r() is None for r in old)  # `cache` is still here: they went with the step
        assert after.length == 3 and cache.self_k == [None] * len(cache.self_k)
        with pytest.raises(RuntimeError, match="spent"):
            model.decode_step(tgt[:, 2], None, mask, cache)
        assert kept.length == 1
        again, _ = model.decode_step(tgt[:, 1], None, mask, kept)  # not spent
        assert again.shape == logits.shape

"""Lexically constrained beam search (`mtkit.search.constraints`): every constraint appears, the
scores are the model's, batching changes nothing, and it composes with prefixes, n-best,
no-repeat n-grams and ensembles."""

from __future__ import annotations

import math

import pytest
import torch
from scripted import A, B, C, Scripted, random_model, random_src

from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS, PAD
from mtkit.search.beam import beam_search
from mtkit.search.constraints import allocate, automaton, constrained_beam_search, move, tables
from mtkit.search.ensemble import Ensemble

SRC = torch.tensor([[A, B, C, EOS]])
D = 7  # a fourth content token of the scripted vocabulary (V = 8)

# The likeliest output is [A]; C only comes after B, which beam search drops at once.
HIDDEN = Scripted(
    {
        (): {A: 0.7, B: 0.3},
        (A,): {EOS: 0.9, C: 0.1},
        (B,): {C: 0.5, EOS: 0.5},
        (B, C): {EOS: 1.0},
        (A, C): {EOS: 1.0},
    }
)


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens)))


def test_the_constrained_output_contains_the_phrase_at_the_models_score():
    assert beam_search(HIDDEN, SRC, SearchOptions(beam=2, lenpen=0.0))[0][0].tokens == [A]
    best = constrained_beam_search(HIDDEN, SRC, [[[[B, C]]]], SearchOptions(beam=2, lenpen=0.0))[0][
        0
    ]
    assert best.tokens == [B, C]
    assert best.log_prob == pytest.approx(math.log(0.3 * 0.5 * 1.0))
    one = constrained_beam_search(HIDDEN, SRC, [[[[C]]]], SearchOptions(beam=3, lenpen=0.0))[0][0]
    assert one.tokens == [B, C]  # 0.3 * 0.5 beats A C's 0.7 * 0.1
    assert one.log_prob == pytest.approx(math.log(0.15))
    # A beam of 2 has one slot per bank: the unlikely C at once, and A; B is crowded out
    assert constrained_beam_search(HIDDEN, SRC, [[[[C]]]], SearchOptions(beam=2, lenpen=0.0))[0][
        0
    ].tokens == [
        A,
        C,
    ]


def test_one_alternative_of_a_constraint_is_enough():
    both = constrained_beam_search(HIDDEN, SRC, [[[[D], [C]]]], SearchOptions(beam=4, lenpen=0.0))[
        0
    ][0]
    assert both.tokens == [B, C]  # D is never likely: C meets the constraint


def test_constraints_in_any_order_and_an_abandoned_match_starts_over():
    loop = Scripted(
        {p: {A: 0.4, B: 0.3, C: 0.2, EOS: 0.1} for p in _prefixes([A, B, C], 6)}, max_positions=16
    )
    hyps = constrained_beam_search(
        loop,
        SRC,
        [[[[C, A]], [[B, B]]]],
        SearchOptions(beam=6, lenpen=0.0, max_len_a=0.0, max_len_b=8),
    )[0]
    assert hyps and all(contains(h.tokens, [C, A]) and contains(h.tokens, [B, B]) for h in hyps)


def _prefixes(tokens: list[int], longest: int) -> list[tuple]:
    out = [()]
    for _ in range(longest):
        out += [p + (t,) for p in out if len(p) == len(out[-1]) for t in tokens]
    return list(dict.fromkeys(out))


def test_the_automaton_finds_a_phrase_that_restarts_inside_a_failed_match():
    t = tables([[[[A, A, B]]]], torch.device("cpu"))
    node, met = t.roots.clone(), torch.zeros(1, dtype=torch.long)
    for token in (A, A, A, B):  # "a a b" inside "a a a b"
        node, met = move(t, node, met, torch.tensor([token]))
    assert met.tolist() == [1]
    auto = automaton([[[A, B]], [[B]]])
    assert auto.outputs[auto.moves[auto.moves[0][A]][B]] == 0b11  # "b" ends inside "a b"
    assert auto.weights == [2, 1]


def test_beams_are_filled_from_the_banks_in_turn():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, float("-inf"), -5.0]])
    bank = torch.tensor([[0, 0, 1, 2, 2, 1]])
    # best of bank 2, of bank 1, of bank 0, then the second best of banks 1 and 0; -inf last
    assert allocate(scores, bank).tolist() == [[3, 2, 0, 5, 1, 4]]


@pytest.mark.parametrize("nbest", [1, 3])
def test_batched_equals_one_by_one_with_zero_one_and_three_constraints(nbest):
    model, src = random_model(), random_src(6)
    wanted = [
        [],
        [[[10]]],
        [[[20, 21]], [[22]], [[23], [24, 25]]],
        [],
        [[[30, 31, 32]]],
        [[[11]], [[12]], [[13]]],
    ]
    together = constrained_beam_search(
        model, src, wanted, SearchOptions(beam=6, max_len_a=3.0, max_len_b=10, nbest=nbest)
    )
    alone = [
        constrained_beam_search(
            model,
            src[i : i + 1, : int((src[i] != PAD).sum())],
            [wanted[i]],
            SearchOptions(beam=6, max_len_a=3.0, max_len_b=10, nbest=nbest),
        )[0]
        for i in range(6)
    ]
    assert [[h.tokens for h in x] for x in together] == [[h.tokens for h in x] for x in alone]
    for hyps, sentence in zip(together, wanted, strict=True):
        assert 1 <= len(hyps) <= nbest  # fewer where fewer met them within the limit
        for h in hyps:
            assert all(any(contains(h.tokens, p) for p in alts) for alts in sentence)
    plain = beam_search(model, src, SearchOptions(beam=6, max_len_a=3.0, max_len_b=10, nbest=nbest))
    for i in (0, 3):  # no constraints: plain beam search's output
        assert [h.tokens for h in together[i]] == [h.tokens for h in plain[i]]


def test_nbest_hypotheses_all_meet_the_constraints_distinct_and_sorted():
    loop = Scripted(
        {p: {A: 0.3, B: 0.2, C: 0.2, EOS: 0.3} for p in _prefixes([A, B, C], 6)}, max_positions=16
    )
    src = torch.tensor([[A, B, C, EOS], [A, B, EOS, PAD]])
    hyps = constrained_beam_search(
        loop,
        src,
        [[[[C, C]]], [[[B]], [[C]]]],
        SearchOptions(beam=5, max_len_a=0.0, max_len_b=6, nbest=4),
    )
    for nbest, phrases in zip(hyps, ([[C, C]], [[B], [C]]), strict=True):
        assert len({tuple(h.tokens) for h in nbest}) == 4
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        assert all(contains(h.tokens, p) for h in nbest for p in phrases)


def test_constraints_with_a_prefix_and_with_an_ensemble_of_one():
    model, src = random_model(), random_src(3)
    wanted = [[[[12]]], [], [[[14, 15]]]]
    prefixes = [[30, 31], [32], []]
    hyps = constrained_beam_search(
        model, src, wanted, SearchOptions(beam=4, max_len_a=3.0, max_len_b=10), prefixes=prefixes
    )
    for h, pre, sentence in zip(hyps, prefixes, wanted, strict=True):
        assert h[0].tokens[: len(pre)] == pre
        assert all(contains(h[0].tokens, alts[0]) for alts in sentence)
    one = constrained_beam_search(
        Ensemble([model]),
        src,
        wanted,
        SearchOptions(beam=4, max_len_a=3.0, max_len_b=10),
        prefixes=prefixes,
    )
    assert [h[0].tokens for h in one] == [h[0].tokens for h in hyps]
    assert [h[0].score for h in one] == pytest.approx([h[0].score for h in hyps], abs=1e-4)


def test_a_constraint_may_repeat_an_ngram_that_no_repeat_forbids_elsewhere():
    loop = Scripted({p: {A: 0.5, B: 0.4, EOS: 0.1} for p in _prefixes([A, B], 6)}, max_positions=16)
    free = beam_search(
        loop, SRC, SearchOptions(beam=3, max_len_a=0.0, max_len_b=6, no_repeat_ngram=1)
    )
    assert sorted(free[0][0].tokens) in ([A], [A, B], [B])  # each token at most once
    hyps = constrained_beam_search(
        loop,
        SRC,
        [[[[A, A]]]],
        SearchOptions(beam=3, max_len_a=0.0, max_len_b=6, no_repeat_ngram=1),
    )[0]
    assert hyps and contains(hyps[0].tokens, [A, A])


def test_no_hypothesis_where_the_constraints_cannot_fit_the_length_limit():
    model, src = random_model(), random_src(2)
    hyps = constrained_beam_search(
        model, src, [[[[10, 11, 12, 13]]], []], SearchOptions(beam=4, max_len_a=0.0, max_len_b=3)
    )
    assert hyps[0] == [] and len(hyps[1]) == 1


def test_a_completed_phrase_is_not_continued_inside_its_word():
    # C "continues a word": after the phrase [B], C is forbidden, so B then EOS
    table = {(): {B: 0.6, A: 0.4}, (B,): {C: 0.9, EOS: 0.1}, (A,): {EOS: 1.0}, (B, C): {EOS: 1.0}}
    inside = torch.zeros(8, dtype=torch.bool)
    inside[C] = True
    free = constrained_beam_search(
        Scripted(table), SRC, [[[[B]]]], SearchOptions(beam=2, lenpen=0.0)
    )
    assert free[0][0].tokens == [B, C]
    whole = constrained_beam_search(
        Scripted(table), SRC, [[[[B]]]], SearchOptions(beam=2, lenpen=0.0), inside_word=inside
    )
    assert whole[0][0].tokens == [B]
    assert whole[0][0].log_prob == pytest.approx(math.log(0.06))


def test_phrases_that_overlap_are_met_by_one_output_through_the_failure_links():
    loop = Scripted(
        {p: {A: 0.4, B: 0.3, C: 0.2, EOS: 0.1} for p in _prefixes([A, B, C], 4)}, max_positions=16
    )
    for beam in (2, 3, 4):  # "A B C" meets "A B" and "B C" in 3 tokens: the only way
        hyps = constrained_beam_search(
            loop,
            SRC,
            [[[[A, B]], [[B, C]]]],
            SearchOptions(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=3),
        )
        assert hyps[0][0].tokens == [A, B, C]


def test_a_phrase_may_continue_a_completed_one_inside_its_word():
    # "B" and "B C" (C continues a word): after B, C stays allowed, as it advances "B C"
    table = {(): {B: 0.6, A: 0.4}, (B,): {C: 0.9, EOS: 0.1}, (B, C): {EOS: 1.0}}
    inside = torch.zeros(8, dtype=torch.bool)
    inside[C] = True
    hyps = constrained_beam_search(
        Scripted(table),
        SRC,
        [[[[B]], [[B, C]]]],
        SearchOptions(beam=3, lenpen=0.0, max_len_a=0.0, max_len_b=2),
        inside_word=inside,
    )
    assert hyps[0][0].tokens == [B, C]

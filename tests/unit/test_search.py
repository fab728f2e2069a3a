from __future__ import annotations

import math

import pytest
import torch
from scripted import A, B, C, Scripted, V, stream_in_two_joins

from mtkit.config import ModelConfig
from mtkit.model import build_model
from mtkit.search import (
    GreedyStream,
    Hypothesis,
    beam_search,
    greedy_hypotheses,
    greedy_search,
    length_penalty,
    max_lengths,
)
from mtkit.vocab import BOS, EOS, PAD

SRC = torch.tensor([[A, B, C, EOS]])


def test_beam_finds_a_higher_scoring_output_than_greedy():
    model = Scripted({(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.4, B: 0.3, C: 0.3},
                      (B,): {EOS: 0.9, C: 0.1}})
    assert greedy_search(model, SRC) == [[A]]
    best = beam_search(model, SRC, beam=2, lenpen=0.0)[0][0]
    assert best.tokens == [B]
    assert best.log_prob == pytest.approx(math.log(0.36))
    assert best.log_prob > math.log(0.24)


def test_length_penalty_favours_longer_outputs():
    table = {(): {A: 0.6, B: 0.4}, (A,): {EOS: 1.0}, (B,): {C: 1.0}, (B, C): {A: 1.0},
             (B, C, A): {B: 1.0}, (B, C, A, B): {EOS: 1.0}}
    model = Scripted(table)
    short = beam_search(model, SRC, beam=2, lenpen=0.0, max_len_b=10)[0][0]
    assert short.tokens == [A]
    long = beam_search(model, SRC, beam=2, lenpen=2.0, max_len_b=10)[0][0]
    assert long.tokens == [B, C, A, B]
    assert long.score == pytest.approx(long.log_prob / length_penalty(5, 2.0))
    assert length_penalty(1, 0.6) == pytest.approx((6 / 6) ** 0.6)


def test_maximum_and_minimum_length():
    loop = Scripted({(A,) * n: {A: 0.9, EOS: 0.1} for n in range(0, 60)})
    src = torch.tensor([[A, B, EOS, PAD]])  # 3 real tokens
    out = beam_search(loop, src, beam=3, max_len_a=1.0, max_len_b=2)[0][0]
    assert len(out.tokens) <= 5
    assert len(greedy_search(loop, src, 1.0, 2)[0]) == 5
    early = Scripted({(): {EOS: 0.9, A: 0.1}, (A,): {EOS: 0.9, B: 0.1}, (A, B): {EOS: 1.0}})
    assert beam_search(early, SRC, beam=2, min_len=2)[0][0].tokens == [A, B]
    assert greedy_search(early, SRC, min_len=2)[0] == [A, B]


def test_a_huge_length_limit_is_the_models_positions_not_an_overflow():
    loop = Scripted({(A,) * n: {A: 0.9, EOS: 0.1} for n in range(0, 60)}, max_positions=12)
    for a, b in ((1e20, 0), (1e300, 10), (1.2, 2**63 - 1), (0.0, 10**30)):
        assert len(greedy_search(loop, SRC, a, b)[0]) == 11  # was 1 token, or none
        assert len(beam_search(loop, SRC, 2, 0.0, a, b)[0][0].tokens) == 11
        assert max_lengths(SRC != PAD, a, b, 12).tolist() == [11]  # GreedyStream's too


def test_nbest_lists_are_distinct_and_sorted():
    model = Scripted({(): {A: 0.5, B: 0.3, C: 0.2}})
    hyps = beam_search(model, SRC, beam=3, lenpen=0.0, nbest=3)[0]
    assert [h.tokens for h in hyps] == [[A], [B], [C]]
    assert all(isinstance(h, Hypothesis) for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    with pytest.raises(ValueError, match=r"nbest must be between 1 and the beam size 3"):
        beam_search(model, SRC, beam=3, nbest=4)


def test_finished_sentences_leave_the_batch():
    loop = Scripted({(A,) * n: {A: 1.0} for n in range(0, 10)})
    src = torch.tensor([[A, EOS, PAD, PAD, PAD], [A, B, C, A, EOS]])  # limits 2 and 5
    hyps = beam_search(loop, src, beam=1, max_len_a=1.0, max_len_b=0)
    assert [h[0].tokens for h in hyps] == [[A, A], [A] * 5]
    assert loop.rows == [2, 2, 2, 1, 1, 1]
    loop.rows.clear()
    beam_search(loop, src, beam=3, max_len_a=1.0, max_len_b=0)
    assert loop.rows == [2, 6, 6, 3, 3, 3]  # the first step: one row per sentence


def test_search_goes_on_while_an_open_beam_can_still_win():
    # Three short hypotheses finish at step 2, all worse than the open beam A A A, which
    # only ends at step 4: stopping at N finished would lose it.
    table = {(): {A: 0.6, B: 0.2, C: 0.2}, (B,): {EOS: 0.9, A: 0.1}, (C,): {EOS: 0.9, A: 0.1},
             (A,): {A: 0.99, EOS: 0.01}, (A, A): {A: 0.99, EOS: 0.01},
             (A, A, A): {EOS: 1.0}}
    model = Scripted(table)
    best = beam_search(model, SRC, beam=3, lenpen=0.0, max_len_b=10, nbest=3)[0]
    assert best[0].tokens == [A, A, A]
    assert best[0].log_prob == pytest.approx(math.log(0.6 * 0.99 * 0.99))

    model.rows.clear()  # with nbest 1 the same best, though fewer than 3 have finished
    assert beam_search(model, SRC, beam=3, lenpen=0.0, max_len_b=10)[0][0] == best[0]


def test_a_sentence_stops_once_no_open_beam_can_beat_its_nbest():
    # A eos (p 0.855) ends at step 1; the open beams (B C C ..., A C ...) loop to the limit
    # and score below it from then on: with nbest 1 nothing can beat it any more.
    table = {(): {A: 0.9, B: 0.1}, (A,): {EOS: 0.95, C: 0.05}, (B,): {C: 1.0}}
    table.update({(A,) + (C,) * n: {C: 1.0} for n in range(1, 30)})
    table.update({(B,) + (C,) * n: {C: 1.0} for n in range(1, 30)})
    model = Scripted(table)
    one = beam_search(model, SRC, beam=2, lenpen=0.6, max_len_b=10)[0]
    assert [h.tokens for h in one] == [[A]] and model.rows == [1, 2]
    model.rows.clear()
    two = beam_search(model, SRC, beam=2, lenpen=0.6, max_len_b=10, nbest=2)[0]
    assert two[0] == one[0] and len(two) == 2 and len(model.rows) > 10


def test_greedy_stops_at_its_eos_where_a_beam_of_one_goes_on():
    # eos is the argmax after A (0.6 > 0.4), but A B C A eos scores better under a strong
    # length penalty: a beam of one keeps that open beam and finds it; greedy does not.
    table = {(): {A: 1.0}, (A,): {EOS: 0.6, B: 0.4}, (A, B): {C: 1.0}, (A, B, C): {A: 1.0},
             (A, B, C, A): {EOS: 1.0}}
    greedy = greedy_hypotheses(Scripted(table), SRC, lenpen=2.0)[0]
    assert [h.tokens for h in greedy] == [[A]]
    assert greedy[0].log_prob == pytest.approx(math.log(0.6))
    assert greedy[0].score == pytest.approx(math.log(0.6) / length_penalty(2, 2.0))
    assert beam_search(Scripted(table), SRC, beam=1, lenpen=2.0)[0][0].tokens == [A, B, C, A]


def random_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, heads=4, ffn_dim=64, encoder_layers=2, decoder_layers=2,
                      dropout=0.0, max_positions=64)
    return build_model(cfg, 40, 40).eval()


def random_src(n: int = 6, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (n, 9), generator=g)
    for i in range(n):
        src[i, 3 + i % 6 :] = PAD
        src[i, 3 + i % 6 - 1] = EOS
    return src


def test_beam_one_equals_greedy():
    model, src = random_model(), random_src()
    greedy = greedy_search(model, src, 1.5, 4)
    beam = beam_search(model, src, beam=1, lenpen=0.0, max_len_a=1.5, max_len_b=4)
    assert [h[0].tokens for h in beam] == greedy


def test_results_do_not_depend_on_batching():
    model, src = random_model(2), random_src(6, 3)
    together = beam_search(model, src, beam=4, nbest=2)
    alone = [beam_search(model, src[i : i + 1, : int((src[i] != PAD).sum())], beam=4,
                         nbest=2)[0] for i in range(src.size(0))]
    for a, b in zip(together, alone):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_a_stream_gives_each_sentence_what_greedy_decoding_gives_it_alone():
    """Sentences join a running `GreedyStream` at every step, a long one among them (the
    slots, their columns and source positions grow, and shrink once it has gone); each
    output and score is that of greedy decoding alone."""
    model = random_model(4)
    short = random_src(10, 5)
    long = torch.randint(4, 40, (1, 30), generator=torch.Generator().manual_seed(6))
    long[0, -1] = EOS
    stream = GreedyStream(model, lenpen=0.6, max_len_a=1.5, max_len_b=4)
    sources, got, widest, after = {}, {}, 0, None
    while 0 not in got:  # key 0, the long sentence, joins first; 1-3 short ones a step
        batch = long if not sources else short[len(sources) % 10 :][: 1 + len(sources) % 3]
        keys = list(range(len(sources), len(sources) + batch.size(0)))
        sources.update(zip(keys, batch))
        stream.add(batch, keys)
        widest = max(widest, stream.cache.columns)
        got.update(stream.step())
    while len(stream):
        after = stream.cache.columns if after is None else after
        got.update(stream.step())
    assert sorted(got) == list(sources) and len(sources) > 20
    for k, row in sources.items():
        alone = greedy_hypotheses(model, row[None, : int((row != PAD).sum())], 0.6, 1.5, 4)
        assert got[k].tokens == alone[0][0].tokens
        assert got[k].score == pytest.approx(alone[0][0].score, abs=1e-4)
    assert widest >= 1.5 * 30 + 4  # the long sentence's output fitted
    assert after < widest / 2  # and the room it took went with it
    assert stream.cache is None  # an empty stream holds no memory


def test_a_stream_under_bf16_autocast_keeps_bf16_caches_and_mostly_agrees():
    """The dtype path CUDA takes, on the CPU: the slots hold what the attention
    projections give (bf16), not the memory's fp32. bf16 rounding depends on the batch's
    shapes, so most outputs, not all, must be those of batched greedy decoding."""
    model = random_model(5)
    src = random_src(8, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, dtype = stream_in_two_joins(model, src, 1.5, 4)
        alone = greedy_hypotheses(model, src, 0.6, 1.5, 4)
    assert dtype == torch.bfloat16
    assert sorted(got) == list(range(8))
    assert sum(got[k].tokens == alone[k][0].tokens for k in range(8)) >= 6


def test_beam_never_emits_pad_or_bos():
    model, src = random_model(3), random_src()
    for hyps in beam_search(model, src, beam=5, nbest=5):
        for h in hyps:
            assert PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens


def test_no_repeat_ngram_blocks_exactly_the_repeated_ngram():
    from mtkit.search import ban_repeated_ngrams

    history = torch.tensor([[A, B, C, A, B]])  # the 2-gram (A, B) and the suffix B
    lprobs = torch.zeros(1, V)
    ban_repeated_ngrams(lprobs, history, 3)  # (A, B) then C was seen: C is banned
    assert lprobs[0].tolist() == [0.0 if t != C else float("-inf") for t in range(V)]
    lprobs = torch.zeros(1, V)
    ban_repeated_ngrams(lprobs, history, 2)  # after B came C: C is banned
    assert torch.isinf(lprobs[0]).nonzero().flatten().tolist() == [C]
    lprobs = torch.zeros(1, V)
    ban_repeated_ngrams(lprobs, history, 1)  # every token seen so far
    assert torch.isinf(lprobs[0]).nonzero().flatten().tolist() == [A, B, C]
    lprobs = torch.zeros(1, V)
    ban_repeated_ngrams(lprobs, history, 4)  # (B, C, A) was never followed... by anything
    assert not torch.isinf(lprobs).any()


@pytest.mark.parametrize("search", ["greedy", "beam", "sampling"])
def test_no_repeat_ngram_stops_a_loop_in_greedy_beam_and_sampling(search):
    from mtkit.search import sample_search

    loop = Scripted({(A, B) * n: {A: 0.9, EOS: 0.1} for n in range(0, 20)}
                    | {(A, B) * n + (A,): {B: 0.9, EOS: 0.1} for n in range(0, 20)})
    if search == "greedy":
        free = greedy_search(loop, SRC, max_len_b=12)[0]
        blocked = greedy_search(loop, SRC, max_len_b=12, no_repeat_ngram=2)[0]
    elif search == "beam":  # a length penalty that favours long outputs
        free = beam_search(loop, SRC, beam=2, lenpen=3.0, max_len_b=12)[0][0].tokens
        hyps = beam_search(loop, SRC, beam=2, lenpen=3.0, max_len_b=12, nbest=2,
                           no_repeat_ngram=2)[0]
        assert all(len(set(zip(h.tokens, h.tokens[1:]))) == len(h.tokens) - 1 for h in hyps)
        blocked = hyps[0].tokens
    else:  # 200 samples: each one is cut at the repeat, whatever it drew before
        free = max((h.tokens for h in sample_search(loop, SRC, [5], 200, max_len_b=12)[0]),
                   key=len)
        drawn = [h.tokens for h in sample_search(loop, SRC, [5], 200, max_len_b=12,
                                                 no_repeat_ngram=2)[0]]
        assert all(tokens == [A, B, A][:len(tokens)] for tokens in drawn)
        blocked = max(drawn, key=len)
    assert free[:4] == [A, B, A, B]
    assert blocked == [A, B, A]  # a second (A, B) is forbidden: eos is all that is left


FIRST = {(): {A: 0.5, B: 0.3, C: 0.2}}  # then eos


def first_tokens(samples: int, seed: int = 1, **kw) -> list[int]:
    from mtkit.search import sample_search

    hyps = sample_search(Scripted(FIRST), SRC, seeds=[seed], samples=samples, **kw)[0]
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
    from mtkit.search import sample_search

    model = Scripted({(): {A: 0.4, B: 0.3, C: 0.3}, (A,): {B: 0.5, C: 0.5},
                      (B,): {A: 0.5, EOS: 0.5}, (C,): {A: 0.5, EOS: 0.5}})
    src = torch.tensor([[A, B, C, EOS], [A, EOS, PAD, PAD], [B, C, EOS, PAD]])
    together = sample_search(model, src, seeds=[7, 8, 9], samples=4)
    # The first step runs one row per sentence; then each sample has its own row, which
    # leaves the batch when the sample ends.
    rows = model.rows[1:]
    assert model.rows[0] == 3 and rows[0] == 12 and rows == sorted(rows, reverse=True)
    alone = [sample_search(model, src[i:i + 1, :], seeds=[s], samples=4)[0]
             for i, s in enumerate((7, 8, 9))]
    assert [[h.tokens for h in x] for x in together] == [[h.tokens for h in x] for x in alone]
    again = sample_search(model, src, seeds=[7, 8, 9], samples=4)
    assert [[h.tokens for h in x] for x in again] == [[h.tokens for h in x] for x in together]
    other = sample_search(model, src, seeds=[1, 2, 3], samples=4)
    assert [[h.tokens for h in x] for x in other] != [[h.tokens for h in x] for x in together]


PREFIXED = {(): {A: 0.9, B: 0.1}, (A,): {EOS: 1.0}, (B,): {C: 0.6, EOS: 0.4},
            (B, C): {A: 0.7, EOS: 0.3}, (B, C, A): {EOS: 1.0}}


def test_the_prefix_is_kept_and_scored_then_search_goes_on():
    from mtkit.search import sample_search

    model = Scripted(PREFIXED)
    assert greedy_search(model, SRC) == [[A]]
    assert greedy_search(model, SRC, prefixes=[[B]]) == [[B, C, A]]
    best = beam_search(model, SRC, beam=3, lenpen=0.0, prefixes=[[B]], nbest=3)[0]
    assert all(h.tokens[0] == B for h in best)
    assert best[0].tokens == [B, C, A]
    assert best[0].log_prob == pytest.approx(math.log(0.1 * 0.6 * 0.7))  # the prefix counts
    drawn = sample_search(model, SRC, seeds=[1], samples=50, prefixes=[[B, C]])[0]
    assert {tuple(h.tokens) for h in drawn} <= {(B, C), (B, C, A)}


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_prefixes_of_different_lengths_batched_equal_one_by_one(search):
    from mtkit.search import sample_search

    model = Scripted(PREFIXED)
    src = torch.tensor([[A, B, C, EOS], [A, EOS, PAD, PAD], [B, C, EOS, PAD]])
    prefixes = [[], [B], [B, C, A]]

    def run(rows, pre, seeds):
        if search == "greedy":
            return greedy_search(model, rows, prefixes=pre)
        if search == "beam":
            return [[h.tokens for h in x] for x in beam_search(model, rows, beam=2,
                                                               prefixes=pre, nbest=2)]
        return [[h.tokens for h in x] for x in sample_search(model, rows, seeds, samples=3,
                                                             prefixes=pre)]

    together = run(src, prefixes, [4, 5, 6])
    alone = [run(src[i:i + 1], [prefixes[i]], [4 + i])[0] for i in range(3)]
    assert together == alone
    assert all(out[:len(p)] == p for out, p in zip(
        (x if search == "greedy" else x[0] for x in together), prefixes))


# --- ensembles -------------------------------------------------------------------------


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_an_ensemble_of_identical_models_equals_the_single_model(search):
    """An ensemble of one is bit-identical to its model (the code promises it: one
    model's logits pass through, in the same batch); two copies of a model agree in
    tokens, and in scores within a tolerance (their mean is computed in another order)."""
    from mtkit.search import Ensemble, sample_search

    model, src = random_model(3), random_src(6, 4)
    twins = Ensemble([model, random_model(3)])  # same weights, separate caches

    def run(m):
        if search == "greedy":
            return [[(tuple(t), 0.0)] for t in greedy_search(m, src)]
        found = (beam_search(m, src, beam=4, nbest=3) if search == "beam"
                 else sample_search(m, src, seeds=list(range(6)), samples=3))
        return [[(tuple(h.tokens), h.log_prob) for h in hyps] for hyps in found]

    single, pair, one = run(model), run(twins), run(Ensemble([model]))
    assert one == single  # one model passes through exactly
    assert [[t for t, _ in hyps] for hyps in pair] == [[t for t, _ in hyps] for hyps in single]
    for a, b in zip(pair, single):
        assert [lp for _, lp in a] == pytest.approx([lp for _, lp in b], abs=1e-4)


def test_an_ensemble_averages_the_models_log_probabilities():
    from mtkit.search import Ensemble

    sure = Scripted({(): {A: 0.9, B: 0.1}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    torn = Scripted({(): {A: 0.001, B: 0.999}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    # mean log-probs: A (log .9 + log .001) / 2 = -3.51, B (log .1 + log .999) / 2 = -1.15
    assert greedy_search(Ensemble([sure, torn]), SRC) == [[B]]
    best = beam_search(Ensemble([sure, torn]), SRC, beam=2, lenpen=0.0, nbest=2)[0]
    p_a, p_b = math.sqrt(0.9 * 0.001), math.sqrt(0.1 * 0.999)  # geometric means
    assert best[0].tokens == [B]
    assert best[0].log_prob == pytest.approx(math.log(p_b / (p_a + p_b)), abs=1e-5)
    assert best[1].log_prob == pytest.approx(math.log(p_a / (p_a + p_b)), abs=1e-5)
    assert sure.rows and torn.rows  # both models ran every step


def test_an_ensemble_of_models_of_different_widths_keeps_each_memory_apart():
    from mtkit.search import Ensemble

    torch.manual_seed(5)
    wide = build_model(ModelConfig(d_model=48, heads=4, ffn_dim=64, encoder_layers=1,
                                   decoder_layers=1, dropout=0.0, max_positions=32),
                       40, 40).eval()
    narrow, src = random_model(6), random_src(4, 7)
    pair = Ensemble([wide, narrow])
    memory, _ = pair.encode(src)
    assert memory.shape[-1] == 48 + 32 and pair.cfg.max_positions == 32
    token = torch.full((4,), BOS)
    logits, _ = pair.decode_step(token, memory, src != PAD, None)
    expected = torch.stack([torch.log_softmax(m.decode_step(token, *m.encode(src), None)[0],
                                              dim=-1) for m in (wide, narrow)]).mean(0)
    assert torch.allclose(logits, expected, atol=1e-5)

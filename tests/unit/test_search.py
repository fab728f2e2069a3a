from __future__ import annotations

import math

import pytest
import torch
from scripted import A, B, C, Scripted, V, random_model, random_src

from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.search.beam import (
    Hypothesis,
    TopCandidates,
    beam_search,
    greedy_hypotheses,
    greedy_search,
    length_penalty,
    max_lengths,
    row_topk,
    step_log_probs,
)

SRC = torch.tensor([[A, B, C, EOS]])


def test_beam_finds_a_higher_scoring_output_than_greedy():
    model = Scripted(
        {(): {A: 0.6, B: 0.4}, (A,): {EOS: 0.4, B: 0.3, C: 0.3}, (B,): {EOS: 0.9, C: 0.1}}
    )
    assert greedy_search(model, SRC) == [[A]]
    best = beam_search(model, SRC, SearchOptions(beam=2, lenpen=0.0))[0][0]
    assert best.tokens == [B]
    assert best.log_prob == pytest.approx(math.log(0.36))
    assert best.log_prob > math.log(0.24)


def test_length_penalty_favours_longer_outputs():
    table = {
        (): {A: 0.6, B: 0.4},
        (A,): {EOS: 1.0},
        (B,): {C: 1.0},
        (B, C): {A: 1.0},
        (B, C, A): {B: 1.0},
        (B, C, A, B): {EOS: 1.0},
    }
    model = Scripted(table)
    short = beam_search(model, SRC, SearchOptions(beam=2, lenpen=0.0, max_len_b=10))[0][0]
    assert short.tokens == [A]
    long = beam_search(model, SRC, SearchOptions(beam=2, lenpen=2.0, max_len_b=10))[0][0]
    assert long.tokens == [B, C, A, B]
    assert long.score == pytest.approx(long.log_prob / length_penalty(5, 2.0))
    assert length_penalty(1, 0.6) == pytest.approx((6 / 6) ** 0.6)


def test_maximum_and_minimum_length():
    loop = Scripted({(A,) * n: {A: 0.9, EOS: 0.1} for n in range(0, 60)})
    src = torch.tensor([[A, B, EOS, PAD]])  # 3 real tokens
    out = beam_search(loop, src, SearchOptions(beam=3, max_len_a=1.0, max_len_b=2))[0][0]
    assert len(out.tokens) <= 5
    assert len(greedy_search(loop, src, SearchOptions(max_len_a=1.0, max_len_b=2))[0]) == 5
    early = Scripted({(): {EOS: 0.9, A: 0.1}, (A,): {EOS: 0.9, B: 0.1}, (A, B): {EOS: 1.0}})
    assert beam_search(early, SRC, SearchOptions(beam=2), min_len=2)[0][0].tokens == [A, B]
    assert greedy_search(early, SRC, min_len=2)[0] == [A, B]


def test_a_huge_length_limit_is_the_models_positions_not_an_overflow():
    loop = Scripted({(A,) * n: {A: 0.9, EOS: 0.1} for n in range(0, 60)}, max_positions=12)
    for a, b in ((1e20, 0), (1e300, 10), (1.2, 2**63 - 1), (0.0, 10**30)):
        assert (
            len(greedy_search(loop, SRC, SearchOptions(max_len_a=a, max_len_b=b))[0]) == 11
        )  # was 1 token, or none
        assert (
            len(
                beam_search(loop, SRC, SearchOptions(beam=2, lenpen=0.0, max_len_a=a, max_len_b=b))[
                    0
                ][0].tokens
            )
            == 11
        )
        assert max_lengths(SRC != PAD, a, b, 12).tolist() == [11]  # GreedyStream's too


def test_nbest_lists_are_distinct_and_sorted():
    model = Scripted({(): {A: 0.5, B: 0.3, C: 0.2}})
    hyps = beam_search(model, SRC, SearchOptions(beam=3, lenpen=0.0, nbest=3))[0]
    assert [h.tokens for h in hyps] == [[A], [B], [C]]
    assert all(isinstance(h, Hypothesis) for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    with pytest.raises(ValueError, match=r"nbest must be between 1 and the beam size 3"):
        beam_search(model, SRC, SearchOptions(beam=3, nbest=4))


def test_finished_sentences_leave_the_batch():
    loop = Scripted({(A,) * n: {A: 1.0} for n in range(0, 10)})
    src = torch.tensor([[A, EOS, PAD, PAD, PAD], [A, B, C, A, EOS]])  # limits 2 and 5
    hyps = beam_search(loop, src, SearchOptions(beam=1, max_len_a=1.0, max_len_b=0))
    assert [h[0].tokens for h in hyps] == [[A, A], [A] * 5]
    assert loop.rows == [2, 2, 2, 1, 1, 1]
    loop.rows.clear()
    beam_search(loop, src, SearchOptions(beam=3, max_len_a=1.0, max_len_b=0))
    assert loop.rows == [2, 6, 6, 3, 3, 3]  # the first step: one row per sentence


def test_search_goes_on_while_an_open_beam_can_still_win():
    # Three short hypotheses finish at step 2, all worse than the open beam A A A, which
    # only ends at step 4: stopping at N finished would lose it.
    table = {
        (): {A: 0.6, B: 0.2, C: 0.2},
        (B,): {EOS: 0.9, A: 0.1},
        (C,): {EOS: 0.9, A: 0.1},
        (A,): {A: 0.99, EOS: 0.01},
        (A, A): {A: 0.99, EOS: 0.01},
        (A, A, A): {EOS: 1.0},
    }
    model = Scripted(table)
    best = beam_search(model, SRC, SearchOptions(beam=3, lenpen=0.0, max_len_b=10, nbest=3))[0]
    assert best[0].tokens == [A, A, A]
    assert best[0].log_prob == pytest.approx(math.log(0.6 * 0.99 * 0.99))

    model.rows.clear()  # with nbest 1 the same best, though fewer than 3 have finished
    assert beam_search(model, SRC, SearchOptions(beam=3, lenpen=0.0, max_len_b=10))[0][0] == best[0]


def test_a_sentence_stops_once_no_open_beam_can_beat_its_nbest():
    # A eos (p 0.855) ends at step 1; the open beams (B C C ..., A C ...) loop to the limit
    # and score below it from then on: with nbest 1 nothing can beat it any more.
    table = {(): {A: 0.9, B: 0.1}, (A,): {EOS: 0.95, C: 0.05}, (B,): {C: 1.0}}
    table.update({(A,) + (C,) * n: {C: 1.0} for n in range(1, 30)})
    table.update({(B,) + (C,) * n: {C: 1.0} for n in range(1, 30)})
    model = Scripted(table)
    one = beam_search(model, SRC, SearchOptions(beam=2, lenpen=0.6, max_len_b=10))[0]
    assert [h.tokens for h in one] == [[A]] and model.rows == [1, 2]
    model.rows.clear()
    two = beam_search(model, SRC, SearchOptions(beam=2, lenpen=0.6, max_len_b=10, nbest=2))[0]
    assert two[0] == one[0] and len(two) == 2 and len(model.rows) > 10


def test_greedy_stops_at_its_eos_where_a_beam_of_one_goes_on():
    # eos is the argmax after A (0.6 > 0.4), but A B C A eos scores better under a strong
    # length penalty: a beam of one keeps that open beam and finds it; greedy does not.
    table = {
        (): {A: 1.0},
        (A,): {EOS: 0.6, B: 0.4},
        (A, B): {C: 1.0},
        (A, B, C): {A: 1.0},
        (A, B, C, A): {EOS: 1.0},
    }
    greedy = greedy_hypotheses(Scripted(table), SRC, SearchOptions(lenpen=2.0))[0]
    assert [h.tokens for h in greedy] == [[A]]
    assert greedy[0].log_prob == pytest.approx(math.log(0.6))
    assert greedy[0].score == pytest.approx(math.log(0.6) / length_penalty(2, 2.0))
    assert beam_search(Scripted(table), SRC, SearchOptions(beam=1, lenpen=2.0))[0][0].tokens == [
        A,
        B,
        C,
        A,
    ]


def test_beam_one_equals_greedy():
    model, src = random_model(), random_src()
    greedy = greedy_search(model, src, SearchOptions(max_len_a=1.5, max_len_b=4))
    beam = beam_search(model, src, SearchOptions(beam=1, lenpen=0.0, max_len_a=1.5, max_len_b=4))
    assert [h[0].tokens for h in beam] == greedy


def test_results_do_not_depend_on_batching():
    model, src = random_model(2), random_src(6, 3)
    together = beam_search(model, src, SearchOptions(beam=4, nbest=2))
    alone = [
        beam_search(
            model, src[i : i + 1, : int((src[i] != PAD).sum())], SearchOptions(beam=4, nbest=2)
        )[0]
        for i in range(src.size(0))
    ]
    for a, b in zip(together, alone):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_each_hypothesis_scores_what_teacher_forcing_gives_its_tokens():
    """The search writes each step's log-probabilities in place (adding the beams'
    scores to them): every n-best hypothesis's log-prob is still the sum of its tokens'
    log-probabilities under the model (this random model runs to the length limit,
    where eos is forced at no cost)."""
    model, src = random_model(4), random_src(4, 2)
    hyps = beam_search(
        model, src, SearchOptions(beam=4, nbest=4, lenpen=0.0, max_len_a=0, max_len_b=12)
    )
    with torch.no_grad():
        for i, sentence in enumerate(hyps):
            assert [len(h.tokens) for h in sentence] == [12] * 4
            for h in sentence:
                length = int((src[i] != PAD).sum())
                tgt_in = torch.tensor([[BOS, *h.tokens[:-1]]])
                logits = model.decode(tgt_in, *model.encode(src[i : i + 1, :length]))
                lprobs = torch.log_softmax(logits, -1)[0]  # (12, V)
                forced = lprobs.gather(1, torch.tensor(h.tokens)[:, None]).sum()
                assert h.log_prob == pytest.approx(float(forced), abs=1e-4)


@pytest.mark.parametrize("vocab", [5, 40, 3000])  # 3000: `row_topk` in blocks
def test_candidates_are_the_best_of_all_extensions(vocab):
    """Each beam's own 2N best, then the sentence's best of those, are the 2N best of
    all N x V extensions: the same scores, and the same (beam, token) for every finite
    one; also with V < 2N, a row with one allowed token, an eos-only row and dead
    (-inf) beams."""
    g = torch.Generator().manual_seed(3)
    b, n = 3, 4
    scores = -torch.rand(b, n, generator=g) * 5
    scores[1, 2:] = float("-inf")  # dead beams
    lprobs = torch.log_softmax(torch.randn(b * n, vocab, generator=g), -1)
    lprobs[0, 1:] = float("-inf")  # a forced token
    lprobs[5] = float("-inf")
    lprobs[5, EOS] = 0.0  # eos only, at the length limit
    total = (scores.unsqueeze(-1) + lprobs.view(b, n, vocab)).view(b, n * vocab)
    want_scores, flat = total.topk(min(2 * n, n * vocab), dim=-1)
    got_scores, beams, tokens = TopCandidates().candidates(scores, lprobs.clone(), None)
    assert torch.equal(got_scores, want_scores)
    for i in range(b):
        finite = torch.isfinite(want_scores[i])
        want = {(int(f) // vocab, int(f) % vocab) for f in flat[i][finite]}
        assert {(int(x), int(y)) for x, y in zip(beams[i][finite], tokens[i][finite])} == want


@pytest.mark.parametrize("width", [4096, 4100, 2000])  # whole blocks, a tail, too few
def test_row_topk_gives_topks_values_with_their_columns(width):
    """The k largest values of each row, best first, equal to `topk`'s, each with a
    column that holds it, no column twice: on rows with many equal values (rounded to
    a coarse grid, as bf16 logits are), a row of -inf but one, an all -inf row, and a
    row whose best values share one block."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(6, width, generator=g) * 4).round() / 2  # many ties
    x[1] = float("-inf")
    x[1, width - 1] = 0.0  # one allowed token, in the last column
    x[2] = float("-inf")
    x[3, 64:74] = 100.0 + torch.arange(10.0)  # the 10 best in one block
    for k in (1, 10):
        values, cols = row_topk(x, k)
        assert torch.equal(values, x.topk(k, dim=-1).values)
        assert torch.equal(x.gather(1, cols), values)
        assert all(len(set(row)) == k for row in cols.tolist())
    assert cols[3].tolist() == list(range(73, 63, -1))


def test_the_first_step_takes_one_row_per_sentence():
    """At the first step (one row per sentence, its N beams the same), the candidates
    are those of the N rows repeated, where only the first beam is live: the same scores
    and tokens, every one from the first beam; also with V < 2N."""
    g = torch.Generator().manual_seed(4)
    b, n = 3, 4
    scores = torch.full((b, n), float("-inf"))
    scores[:, 0] = 0.0
    for vocab in (40, 3, 3000):
        lprobs = torch.log_softmax(torch.randn(b, vocab, generator=g), -1)
        want = TopCandidates().candidates(scores, lprobs.repeat_interleave(n, dim=0), None)
        got = TopCandidates().candidates(scores, lprobs.clone(), None)
        assert got[0].shape == (b, min(2 * n, n * vocab))
        finite = torch.isfinite(want[0])
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[2][finite], want[2][finite])
        assert not got[1][finite].any() and not want[1][finite].any()


def test_beam_never_emits_pad_or_bos():
    model, src = random_model(3), random_src()
    for hyps in beam_search(model, src, SearchOptions(beam=5, nbest=5)):
        for h in hyps:
            assert PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens


def test_no_repeat_ngram_blocks_exactly_the_repeated_ngram():
    from mtkit.search.beam import ban_repeated_ngrams

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
    from mtkit.search.sampling import sample_search

    loop = Scripted(
        {(A, B) * n: {A: 0.9, EOS: 0.1} for n in range(0, 20)}
        | {(A, B) * n + (A,): {B: 0.9, EOS: 0.1} for n in range(0, 20)}
    )
    if search == "greedy":
        free = greedy_search(loop, SRC, SearchOptions(max_len_b=12))[0]
        blocked = greedy_search(loop, SRC, SearchOptions(max_len_b=12, no_repeat_ngram=2))[0]
    elif search == "beam":  # a length penalty that favours long outputs
        free = beam_search(loop, SRC, SearchOptions(beam=2, lenpen=3.0, max_len_b=12))[0][0].tokens
        hyps = beam_search(
            loop, SRC, SearchOptions(beam=2, lenpen=3.0, max_len_b=12, nbest=2, no_repeat_ngram=2)
        )[0]
        assert all(len(set(zip(h.tokens, h.tokens[1:]))) == len(h.tokens) - 1 for h in hyps)
        blocked = hyps[0].tokens
    else:  # 200 samples: each one is cut at the repeat, whatever it drew before
        free = max(
            (
                h.tokens
                for h in sample_search(loop, SRC, SearchOptions(beam=200, max_len_b=12), seeds=[5])[
                    0
                ]
            ),
            key=len,
        )
        drawn = [
            h.tokens
            for h in sample_search(
                loop, SRC, SearchOptions(beam=200, max_len_b=12, no_repeat_ngram=2), seeds=[5]
            )[0]
        ]
        assert all(tokens == [A, B, A][: len(tokens)] for tokens in drawn)
        blocked = max(drawn, key=len)
    assert free[:4] == [A, B, A, B]
    assert blocked == [A, B, A]  # a second (A, B) is forbidden: eos is all that is left


PREFIXED = {
    (): {A: 0.9, B: 0.1},
    (A,): {EOS: 1.0},
    (B,): {C: 0.6, EOS: 0.4},
    (B, C): {A: 0.7, EOS: 0.3},
    (B, C, A): {EOS: 1.0},
}


def test_the_prefix_is_kept_and_scored_then_search_goes_on():
    from mtkit.search.sampling import sample_search

    model = Scripted(PREFIXED)
    assert greedy_search(model, SRC) == [[A]]
    assert greedy_search(model, SRC, prefixes=[[B]]) == [[B, C, A]]
    best = beam_search(model, SRC, SearchOptions(beam=3, lenpen=0.0, nbest=3), prefixes=[[B]])[0]
    assert all(h.tokens[0] == B for h in best)
    assert best[0].tokens == [B, C, A]
    assert best[0].log_prob == pytest.approx(math.log(0.1 * 0.6 * 0.7))  # the prefix counts
    drawn = sample_search(model, SRC, SearchOptions(beam=50), seeds=[1], prefixes=[[B, C]])[0]
    assert {tuple(h.tokens) for h in drawn} <= {(B, C), (B, C, A)}


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_prefixes_of_different_lengths_batched_equal_one_by_one(search):
    from mtkit.search.sampling import sample_search

    model = Scripted(PREFIXED)
    src = torch.tensor([[A, B, C, EOS], [A, EOS, PAD, PAD], [B, C, EOS, PAD]])
    prefixes = [[], [B], [B, C, A]]

    def run(rows, pre, seeds):
        if search == "greedy":
            return greedy_search(model, rows, prefixes=pre)
        if search == "beam":
            return [
                [h.tokens for h in x]
                for x in beam_search(model, rows, SearchOptions(beam=2, nbest=2), prefixes=pre)
            ]
        return [
            [h.tokens for h in x]
            for x in sample_search(model, rows, SearchOptions(beam=3), seeds=seeds, prefixes=pre)
        ]

    together = run(src, prefixes, [4, 5, 6])
    alone = [run(src[i : i + 1], [prefixes[i]], [4 + i])[0] for i in range(3)]
    assert together == alone
    assert all(
        out[: len(p)] == p
        for out, p in zip((x if search == "greedy" else x[0] for x in together), prefixes)
    )


@pytest.mark.parametrize("constrained", [False, True])
def test_beam_search_over_a_large_vocabulary_finds_what_topk_finds(constrained, monkeypatch):
    """Over 3,000 target tokens `best_extensions` searches in blocks (`row_topk`): plain
    and constrained beam search give the same hypotheses and scores as with `topk`
    over every column (a random fp32 model: no equal scores)."""
    import mtkit.search.beam as search
    from mtkit.core.config import ModelConfig
    from mtkit.model.transformer import build_model
    from mtkit.search.constraints import constrained_beam_search

    torch.manual_seed(7)
    cfg = ModelConfig(
        d_model=32,
        heads=4,
        ffn_dim=64,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
        max_positions=64,
        share_embeddings=False,
    )
    model = build_model(cfg, 40, 3000).eval()
    src = random_src(4, 5)

    def run():
        if constrained:
            return constrained_beam_search(
                model,
                src,
                [[[[7, 8]]], [], [[[9]]], [[[10, 11]]]],
                SearchOptions(beam=4, max_len_b=8, nbest=2),
            )
        return beam_search(model, src, SearchOptions(beam=4, max_len_b=8, nbest=2))

    blocked = run()
    calls = []
    monkeypatch.setattr(
        search, "row_topk", lambda x, k, block=64: calls.append(x.size(1)) or x.topk(k, dim=-1)
    )
    plain = run()
    assert calls and set(calls) == {3000}  # the large vocabulary went through row_topk
    for a, b in zip(blocked, plain, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.log_prob for h in a] == pytest.approx([h.log_prob for h in b], abs=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_log_probs_are_fp32_log_softmax_of_the_logits_with_the_rules_applied(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(6, 50) * 4).to(dtype)  # (rows, V)

    class Fixed:
        def decode_step(self, token, memory, src_mask, cache=None):
            return logits.clone(), "cache"

    limits = torch.tensor([9, 9, 9, 9, 9, 3])  # the last row is at its limit
    lprobs, cache = step_log_probs(
        Fixed(),
        torch.zeros(6, dtype=torch.long),
        None,
        torch.ones(6, 4, dtype=torch.bool),
        None,
        3,
        limits,
        min_len=0,
    )
    want = torch.log_softmax(logits.float(), dim=-1)
    assert lprobs.dtype == torch.float32 and cache == "cache"
    other = [t for t in range(50) if t not in (PAD, BOS, EOS)]
    assert torch.equal(lprobs[:5, other], want[:5, other])
    assert (lprobs[:, PAD] == float("-inf")).all() and (lprobs[:, BOS] == float("-inf")).all()
    assert torch.equal(lprobs[:5, EOS], want[:5, EOS])
    assert lprobs[5, EOS] == 0.0 and (lprobs[5, other] == float("-inf")).all()


@pytest.mark.parametrize("read_every", [2, 3, 8])
def test_done_sentences_read_every_few_steps_give_the_hypotheses_of_reading_each_step(read_every):
    """On a GPU the host reads which sentences are done every few steps, and their rows
    stay masked until then: the same tokens, and scores (the rows' batch differs)."""
    from conftest import assert_same_hypotheses

    model, src = random_model(5), random_src(8, 4)
    longest = SearchOptions(beam=2, max_len_a=0.0, max_len_b=10**6)  # to the model's positions
    for options in (SearchOptions(beam=4, nbest=2), SearchOptions(beam=3, lenpen=0.0), longest):
        each_step = beam_search(model, src, options, read_every=1)
        assert_same_hypotheses(beam_search(model, src, options, read_every=read_every), each_step)
    prefixes = [[5, 6], [], [7], [], [], [8, 9, 10], [], []]
    assert_same_hypotheses(
        beam_search(model, src, SearchOptions(beam=4), prefixes=prefixes, read_every=read_every),
        beam_search(model, src, SearchOptions(beam=4), prefixes=prefixes, read_every=1),
    )

from __future__ import annotations

import math

import pytest
import torch
from scripted import A, B, C, Scripted, random_model, random_src

from mtkit.core.config import ModelConfig
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import BOS, EOS, PAD
from mtkit.model.transformer import build_model
from mtkit.search.beam import beam_search, greedy_search
from mtkit.search.ensemble import Ensemble
from mtkit.search.sampling import sample_search

SRC = torch.tensor([[A, B, C, EOS]])


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_an_ensemble_of_identical_models_equals_the_single_model(search):
    """An ensemble of one is bit-identical to its model (the code promises it: one
    model's logits pass through, in the same batch); two copies of a model agree in
    tokens, and in scores within a tolerance (their mean is computed in another order)."""
    model, src = random_model(3), random_src(6, 4)
    twins = Ensemble([model, random_model(3)])  # same weights, separate caches

    def run(m):
        if search == "greedy":
            return [[(tuple(t), 0.0)] for t in greedy_search(m, src)]
        found = (
            beam_search(m, src, SearchOptions(beam=4, nbest=3))
            if search == "beam"
            else sample_search(m, src, SearchOptions(beam=3), seeds=list(range(6)))
        )
        return [[(tuple(h.tokens), h.log_prob) for h in hyps] for hyps in found]

    single, pair, one = run(model), run(twins), run(Ensemble([model]))
    assert one == single  # one model passes through exactly
    assert [[t for t, _ in hyps] for hyps in pair] == [[t for t, _ in hyps] for hyps in single]
    for a, b in zip(pair, single):
        assert [lp for _, lp in a] == pytest.approx([lp for _, lp in b], abs=1e-4)


def test_an_ensemble_averages_the_models_log_probabilities():
    sure = Scripted({(): {A: 0.9, B: 0.1}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    torn = Scripted({(): {A: 0.001, B: 0.999}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    # mean log-probs: A (log .9 + log .001) / 2 = -3.51, B (log .1 + log .999) / 2 = -1.15
    assert greedy_search(Ensemble([sure, torn]), SRC) == [[B]]
    best = beam_search(Ensemble([sure, torn]), SRC, SearchOptions(beam=2, lenpen=0.0, nbest=2))[0]
    p_a, p_b = math.sqrt(0.9 * 0.001), math.sqrt(0.1 * 0.999)  # geometric means
    assert best[0].tokens == [B]
    assert best[0].log_prob == pytest.approx(math.log(p_b / (p_a + p_b)), abs=1e-5)
    assert best[1].log_prob == pytest.approx(math.log(p_a / (p_a + p_b)), abs=1e-5)
    assert sure.rows and torn.rows  # both models ran every step


def test_an_ensemble_of_models_of_different_widths_keeps_each_memory_apart():
    torch.manual_seed(5)
    wide = build_model(
        ModelConfig(
            d_model=48,
            heads=4,
            ffn_dim=64,
            encoder_layers=1,
            decoder_layers=1,
            dropout=0.0,
            max_positions=32,
        ),
        40,
        40,
    ).eval()
    narrow, src = random_model(6), random_src(4, 7)
    pair = Ensemble([wide, narrow])
    memory, _ = pair.encode(src)
    assert memory.shape[-1] == 48 + 32 and pair.cfg.max_positions == 32
    token = torch.full((4,), BOS)
    logits, _ = pair.decode_step(token, memory, src != PAD, None)
    expected = torch.stack(
        [
            torch.log_softmax(m.decode_step(token, *m.encode(src), None)[0], dim=-1)
            for m in (wide, narrow)
        ]
    ).mean(0)
    assert torch.allclose(logits, expected, atol=1e-5)

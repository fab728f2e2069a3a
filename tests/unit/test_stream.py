from __future__ import annotations

import pytest
import torch
from scripted import random_model, random_src, stream_in_two_joins

from mtkit.core.config import ModelConfig
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS, PAD
from mtkit.model.transformer import build_model
from mtkit.search.beam import greedy_hypotheses
from mtkit.search.ensemble import Ensemble
from mtkit.serving.stream import GreedyStream

from conftest import inference_mode_watched

GREEDY = SearchOptions(lenpen=0.6, max_len_a=1.5, max_len_b=4)  # as the stream's


def test_a_stream_gives_each_sentence_what_greedy_decoding_gives_it_alone():
    """Sentences join a running `GreedyStream` at every step, a long one among them (the
    slots, their columns and source positions grow, and shrink once it has gone); each
    output and score is that of greedy decoding alone."""
    model = random_model(4)
    short = random_src(10, 5)
    long = torch.randint(4, 40, (1, 30), generator=torch.Generator().manual_seed(6))
    long[0, -1] = EOS
    stream = GreedyStream(model, SearchOptions(lenpen=0.6, max_len_a=1.5, max_len_b=4))
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
        alone = greedy_hypotheses(model, row[None, : int((row != PAD).sum())], GREEDY)
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
        alone = greedy_hypotheses(model, src, GREEDY)
    assert dtype == torch.bfloat16
    assert sorted(got) == list(range(8))
    assert sum(got[k].tokens == alone[k][0].tokens for k in range(8)) >= 6


def stream_joining_every_step(model, src: torch.Tensor) -> dict:
    """src's rows join a `GreedyStream` (lenpen 0.6, max_len 1.5 * len + 4), 1-3 at each
    step: each row's hypothesis by row."""
    options = SearchOptions(lenpen=0.6, max_len_a=1.5, max_len_b=4)
    stream, got, joined = GreedyStream(model, options), {}, 0
    while joined < src.size(0) or len(stream):
        if joined < src.size(0):
            keys = list(range(joined, min(joined + 1 + joined % 3, src.size(0))))
            stream.add(src[keys], keys)
            joined += len(keys)
        got.update(stream.step())
    return got


def test_an_ensemble_streams_what_its_greedy_decoding_gives_each_sentence_alone():
    """Two models of different widths and depths, each with its own slot cache; a
    stream of one model's ensemble is exactly that model's stream."""
    torch.manual_seed(7)
    wide = build_model(
        ModelConfig(
            d_model=48,
            heads=4,
            ffn_dim=64,
            encoder_layers=1,
            decoder_layers=1,
            dropout=0.0,
            max_positions=64,
        ),
        40,
        40,
    ).eval()
    narrow = random_model(9)
    pair, src = Ensemble([wide, narrow]), random_src(9, 3)
    got = stream_joining_every_step(pair, src)
    assert sorted(got) == list(range(9))
    for k, row in enumerate(src):
        alone = greedy_hypotheses(pair, row[None, : int((row != PAD).sum())], GREEDY)
        assert got[k].tokens == alone[0][0].tokens
        assert got[k].score == pytest.approx(alone[0][0].score, abs=1e-4)
    assert stream_joining_every_step(Ensemble([wide]), src) == stream_joining_every_step(wide, src)


def test_a_line_stream_steps_in_inference_mode_and_gives_the_engines_outputs(tiny_engine):
    """A server's stream (`LineStream`) runs its steps in inference mode, as the engine's
    own searches do, and each line gets what the engine's greedy decoding gives it."""
    from mtkit.core.search_options import SearchOptions
    from mtkit.serving.stream import LineStream

    engine, seen = inference_mode_watched(tiny_engine)
    opts = SearchOptions(beam=1, max_len_a=0, max_len_b=6)
    lines = ["A dog runs.", "Two men are sitting.", "A cat."]
    stream = LineStream(engine, opts)
    stream.add(lines, [0, 1, 2], opts)
    got = {}
    while len(got) < 3:
        got.update(stream.step())
    assert seen and all(seen) and not torch.is_inference_mode_enabled()
    want = tiny_engine.translate(lines, opts)
    assert [[h.tokens for h in got[i]] for i in range(3)] == [[h.tokens for h in w] for w in want]

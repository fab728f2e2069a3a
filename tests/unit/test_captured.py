"""Search in fixed shapes (`PreallocatedCache`, `captured.FixedShapes`) and captured decoder
steps (`mtkit.search.captured`), on a CPU: the same outputs as today's search. The
captures are an eager stand-in here (a CPU records no graphs); `test_cuda.py` runs the
real ones."""

from __future__ import annotations

import pytest
import torch
from scripted import InFixedShapes, random_model, random_src

from mtkit.core.errors import OptionError
from mtkit.core.search_options import SearchOptions
from mtkit.model.cache import BeamCache, PreallocatedCache, preallocated_capacity
from mtkit.search.beam import beam_search, greedy_hypotheses
from mtkit.search.captured import CapturedDecoder
from mtkit.search.constraints import constrained_beam_search
from mtkit.search.ensemble import Ensemble
from mtkit.search.sampling import sample_search
from mtkit.tuning import capture
from mtkit.tuning.capture import graph_choice

from conftest import assert_same_hypotheses


def stand_in(replays: list | None = None):
    """A capture that records nothing: each replay runs the step eagerly (on the slot's
    own tensors, as a graph would). `replays` counts them."""

    def capture(step):
        def replay():
            if replays is not None:
                replays.append(1)
            step()

        return replay

    return capture


class Shapes:
    """A step model that notes the rows of every step it runs."""

    def __init__(self, model):
        self.model, self.rows = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def decode_step(self, token, memory, src_mask, cache):
        self.rows.append(token.size(0))
        return self.model.decode_step(token, memory, src_mask, cache)


@torch.inference_mode()
def test_steps_through_a_preallocated_cache_give_a_beam_caches_logits_in_one_shape():
    model, src = random_model(3), random_src(4, 2)
    memory, src_mask = model.encode(src)
    tgt = torch.randint(4, 40, (4, 7))
    _, beam = model.decode_step(tgt[:, 0], memory, src_mask, None)
    fixed = beam.preallocated(16)
    assert isinstance(fixed, PreallocatedCache) and fixed.capacity == 16
    reorder = torch.tensor([2, 0, 3, 1])
    for t in range(1, tgt.size(1)):
        beam = beam.index_select(reorder)
        assert fixed.index_select(reorder) is fixed  # a reorder is in place
        want, beam = model.decode_step(tgt[:, t], None, src_mask, beam)
        got, after = model.decode_step(tgt[:, t], None, src_mask, fixed)
        assert after is fixed and fixed.self_k[0].shape == (4, 4, 16, 8)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert int(fixed.position) == tgt.size(1) == beam.length
    fewer = fixed.index_select(torch.tensor([3, 0]), torch.tensor([3, 0]))
    assert fewer is not fixed and fewer.self_k[0].shape == (2, 4, 16, 8)
    want, _ = model.decode_step(
        tgt[[3, 0], 0],
        None,
        src_mask[[3, 0]],
        beam.index_select(torch.tensor([3, 0]), torch.tensor([3, 0])),
    )
    got, _ = model.decode_step(tgt[[3, 0], 0], None, src_mask[[3, 0]], fewer)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_preallocated_capacity_is_a_multiple_of_sixteen_within_the_positions():
    assert preallocated_capacity(0, 64) == 16  # bos alone
    assert preallocated_capacity(15, 64) == 16 and preallocated_capacity(16, 64) == 32
    assert preallocated_capacity(60, 64) == 64
    with pytest.raises(ValueError, match="first step"):
        BeamCache.first((), ()).preallocated(16)


LONG = SearchOptions(max_len_b=30)
DRAWS = SearchOptions(beam=3, topk=5)  # three draws per sentence, from the top five
OPTIONS = [
    SearchOptions(beam=4, nbest=2),
    SearchOptions(beam=3, lenpen=0.0),
    SearchOptions(beam=2, max_len_a=0.0, max_len_b=10**6),  # to the model's positions
]


def test_only_a_captured_decoder_is_searched_in_fixed_shapes():
    from mtkit.search.beam import GROWING, step_shapes
    from mtkit.search.shortlist import Shortlisted

    model = random_model(5)
    decoder = CapturedDecoder(model)
    assert step_shapes(model) is GROWING and step_shapes(Ensemble([model, decoder])) is GROWING
    for fixed in decoder, Ensemble([decoder, decoder]), Shortlisted(decoder, torch.arange(3, 20)):
        assert step_shapes(fixed).fixed
        assert step_shapes(fixed).max_positions == model.cfg.max_positions


@pytest.mark.parametrize("read_every", [1, 3, 8])
def test_beam_search_in_fixed_shapes_gives_todays_hypotheses_in_few_shapes(read_every):
    model, src = random_model(5), random_src(8, 4)
    for options in OPTIONS:
        shapes = Shapes(InFixedShapes(model))
        got = beam_search(shapes, src, options, read_every=read_every)
        assert_same_hypotheses(got, beam_search(model, src, options))
        # 8 sentences: 8, then at most 4, 2, 1 of them (and the first step's one row each)
        assert len(set(shapes.rows[1:])) <= 4 and shapes.rows[1] == 8 * options.beam
    prefixes = [[5, 6], [], [7], [], [], [8, 9, 10], [], []]
    assert_same_hypotheses(
        beam_search(InFixedShapes(model), src, SearchOptions(beam=4), prefixes=prefixes),
        beam_search(model, src, SearchOptions(beam=4), prefixes=prefixes),
    )


def test_an_ensemble_of_models_in_fixed_shapes_is_searched_in_them_with_todays_hypotheses():
    """An ensemble steps in fixed shapes where all its models do: each model's cache is
    preallocated (`EnsembleCache.preallocated`), and the outputs are the eager ones."""
    first, second, src = random_model(5), random_model(6), random_src(8, 4)
    fixed = Shapes(Ensemble([InFixedShapes(first), InFixedShapes(second)]))
    got = beam_search(fixed, src, SearchOptions(beam=3))
    assert_same_hypotheses(got, beam_search(Ensemble([first, second]), src, SearchOptions(beam=3)))
    assert len(set(fixed.rows[1:])) <= 4 and fixed.rows[1] == 8 * 3


def test_sentences_done_stay_in_the_batch_until_half_are_done():
    """Eager search lets each sentence go when it is done; in fixed shapes they stay,
    masked, until at least half of the batch is done."""
    model, src = random_model(5), random_src(8, 4)
    eager, fixed = Shapes(model), Shapes(InFixedShapes(model))
    beam_search(eager, src, SearchOptions(beam=2))
    beam_search(fixed, src, SearchOptions(beam=2))
    assert len(set(fixed.rows)) < len(set(eager.rows))
    for before, after in zip(fixed.rows[1:], fixed.rows[2:]):
        assert after == before or after <= before // 2


@pytest.mark.parametrize("read_every", [1, 4])
def test_greedy_and_sampling_in_fixed_shapes_give_todays_outputs(read_every):
    model, src = random_model(5), random_src(8, 4)
    assert_same_hypotheses(
        greedy_hypotheses(InFixedShapes(model), src, LONG, read_every=read_every),
        greedy_hypotheses(model, src, LONG),
    )
    seeds = list(range(8))
    assert_same_hypotheses(
        sample_search(InFixedShapes(model), src, DRAWS, seeds=seeds),
        sample_search(model, src, DRAWS, seeds=seeds),
    )


def test_captured_steps_replay_and_give_todays_hypotheses(monkeypatch):
    replays: list = []
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in(replays))
    model, src = random_model(5), random_src(8, 4)
    decoder = CapturedDecoder(model)
    with torch.inference_mode():
        for options in OPTIONS:
            got = beam_search(decoder, src, options)
            assert_same_hypotheses(got, beam_search(model, src, options))
        assert_same_hypotheses(
            greedy_hypotheses(decoder, src, LONG),
            greedy_hypotheses(model, src, LONG),
        )
        constraints = [[[[7, 8]]]] + [[] for _ in range(7)]
        assert_same_hypotheses(
            constrained_beam_search(decoder, src, constraints, SearchOptions(beam=4)),
            constrained_beam_search(model, src, constraints, SearchOptions(beam=4)),
        )
    record = decoder.record()
    # every step after a batch's first (which makes the cache) is a replay
    assert record["replayed_steps"] == len(replays) > 10 * record["eager_steps"] > 0
    assert record["shapes"] >= 4 and record["failed"] == 0


def test_each_model_of_an_ensemble_replays_its_own_steps(monkeypatch):
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in())
    first, second = random_model(5), random_model(6)
    src = random_src(8, 4)
    decoders = [CapturedDecoder(first), CapturedDecoder(second)]
    with torch.inference_mode():
        got = beam_search(Ensemble(decoders), src, SearchOptions(beam=3))
        want = beam_search(Ensemble([first, second]), src, SearchOptions(beam=3))
    assert_same_hypotheses(got, want)
    assert [d.record()["replayed_steps"] > 0 for d in decoders] == [True, True]


def test_a_step_that_cannot_be_captured_runs_eagerly_and_is_recorded(monkeypatch, caplog):
    def failing(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    model, src = random_model(5), random_src(8, 4)
    decoder = CapturedDecoder(model, capture=failing)
    with torch.inference_mode():
        got = beam_search(decoder, src, SearchOptions(beam=3))
    assert_same_hypotheses(got, beam_search(model, src, SearchOptions(beam=3)))
    record = decoder.record()
    assert record["replayed_steps"] == 0 and record["failed"] >= 1 and record["shapes"] == 0
    assert "run eagerly: operation not permitted" in caplog.text
    assert record["failed"] > 1 and caplog.text.count("run eagerly") == 1  # once per reason


@pytest.mark.parametrize("bound", [{"max_slots": 1}, {"max_bytes": 1}])
def test_a_slot_let_go_is_captured_again_when_its_shape_returns(bound):
    """One slot for all shapes (at most one, or as many as 1 byte holds, but never
    none): each new shape takes it, copying the search's cache in."""
    model, src = random_model(5), random_src(8, 4)
    captures: list = []

    def counting(step):
        captures.append(1)
        return step

    decoder = CapturedDecoder(model, capture=counting, **bound)
    with torch.inference_mode():
        for _ in range(2):
            got = beam_search(decoder, src, SearchOptions(beam=4))
            assert_same_hypotheses(got, beam_search(model, src, SearchOptions(beam=4)))
    assert len(decoder.slots) == 1 and len(captures) >= 8
    assert decoder.nbytes == next(iter(decoder.slots.values())).cache.nbytes > 0


def test_cuda_graphs_are_taken_where_the_device_captures_steps(monkeypatch):
    cpu = torch.device("cpu")
    assert graph_choice("off", cpu) == {"graphs": "off", "asked": "off"}
    assert graph_choice("auto", cpu)["graphs"] == "off"
    assert "no captured steps on cpu" in graph_choice("on", cpu)["why"]
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in())
    assert graph_choice("auto", cpu)["graphs"] == "on"
    with pytest.raises(OptionError, match="cuda_graphs must be auto, on or off, got 'yes'"):
        graph_choice("yes", cpu)


def test_the_engine_translates_the_same_lines_with_captured_steps(monkeypatch, trained, corpus):
    """A trained model through `mtkit.engines`: beam 4 with n-best 2 and greedy, in
    fixed shapes with captured steps (the stand-in), against the eager engine."""
    from mtkit.engines.loader import load_engine

    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    lines = corpus["test.en"].read_text().splitlines()[:40]
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in())
    eager = load_engine(checkpoint, "cpu", precision="fp32")
    fixed = load_engine(checkpoint, "cpu", precision="fp32", cuda_graphs="on")
    assert fixed.precision["graphs"] == {"graphs": "on", "asked": "on"} and fixed.graphs
    for options in (SearchOptions(beam=4, nbest=2), SearchOptions(beam=1)):
        assert_same_hypotheses(fixed.translate(lines, options), eager.translate(lines, options))
    assert fixed.graph_record()["replayed_steps"] > 0


def test_validation_decodes_with_captured_steps_and_scores_the_same(
    prepared, tmp_path, corpus, monkeypatch
):
    """decode.cuda_graphs during training: validation's greedy search runs in fixed
    shapes through one `CapturedDecoder`, kept from one validation to the next, and
    scores what eager validation scores."""
    import json
    import shutil

    from mtkit.core.config import config_from_dict
    from mtkit.training.loop import train

    from conftest import tiny_config_dict

    replays: list = []
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in(replays))
    valid = {}
    for graphs in ("off", "on"):
        run = tmp_path / graphs / "run"
        shutil.copytree(prepared, run)
        train(config_from_dict(tiny_config_dict(corpus, run, decode={"cuda_graphs": graphs})))
        valid[graphs] = [
            (e["valid_bleu"], e["valid_loss"])
            for e in map(json.loads, (run / "metrics.jsonl").open())
            if e["event"] == "valid"
        ]
        if graphs == "off":
            assert not replays
    assert len(valid["on"]) == 2 and valid["on"] == valid["off"]
    assert len(replays) > 20


def test_a_gpus_batch_budget_is_what_a_quarter_of_its_free_memory_holds():
    """The budget (source tokens x beam) where decode.batch_tokens is the default: rows
    of one-token sources, the costliest per budget token, fit a quarter of the free
    memory; never below the CPU default, never above the cap."""
    from mtkit.core.config import config_from_dict
    from mtkit.core.search_options import BATCH_TOKENS
    from mtkit.tuning.budget import MAX_DEVICE_BATCH_TOKENS, device_batch_tokens

    cfg = config_from_dict(
        {"model": {"d_model": 256, "decoder_layers": 3, "heads": 4, "ffn_dim": 1024}}
    )
    gib = 2**30
    h200 = device_batch_tokens(cfg, 8000, 140 * gib)
    assert h200["free_gb"] == 140.0 and "0.25 of the free memory" in h200["rule"]
    # a budget token: S = 1, 11 tokens + bos rounded up to 16 columns; bytes in bf16
    elements = 6 * 3 * 16 * 256 + 2 * 3 * 256  # cache (three copies) and source, per row
    row = 2 * elements + 12 * 8000
    assert h200["tokens"] == int(0.25 * 140 * gib // row) > 15 * BATCH_TOKENS
    half = device_batch_tokens(cfg, 8000, 70 * gib)["tokens"]
    assert half == pytest.approx(h200["tokens"] / 2, rel=1e-3)
    fp32_pair = device_batch_tokens(cfg, 8000, 140 * gib, element_bytes=4, models=2)
    assert fp32_pair["tokens"] == int(0.25 * 140 * gib // (2 * (4 * elements + 12 * 8000)))
    assert device_batch_tokens(cfg, 8000, gib // 4)["tokens"] == BATCH_TOKENS
    assert device_batch_tokens(cfg, 8000, 10_000 * gib)["tokens"] == MAX_DEVICE_BATCH_TOKENS


def stream_outputs(model, sources: dict) -> tuple[dict, list]:
    """`sources` (key -> src row) joining a `GreedyStream` a few at a step, the first a
    long one: each key's hypothesis, and the cache's capacities at each step."""
    from mtkit.serving.stream import GreedyStream

    stream = GreedyStream(model, SearchOptions(lenpen=0.6, max_len_a=1.5, max_len_b=4))
    keys, got, capacities = list(sources), {}, []
    while keys or len(stream):
        joining, keys = keys[: 1 + len(got) % 3], keys[1 + len(got) % 3 :]
        if joining:
            src = torch.nn.utils.rnn.pad_sequence(
                [sources[k] for k in joining], batch_first=True, padding_value=0
            )
            stream.add(src, joining)
        capacities.append(stream.capacity)
        got.update(stream.step())
    return got, capacities


@pytest.mark.parametrize("captured_steps", [False, True])
@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_a_stream_in_fixed_shapes_gives_each_sentence_what_greedy_gives_it_alone(
    kernel, captured_steps, monkeypatch
):
    """A server's stream stepping all its slots over all columns (free slots masked,
    stepped on) gives each sentence its greedy output alone, also in a slot freed by
    another sentence; with captured steps (the stand-in) each step is a replay. With
    matmul attention (a GPU's), a free slot attending to nothing would leave NaN keys
    in its columns, which a later sentence there would read, weighted 0, as NaN."""
    from mtkit.core.vocab import EOS, PAD

    model = random_model(4).use_attention(kernel)
    short = random_src(12, 5)
    long = torch.randint(4, 40, (30,), generator=torch.Generator().manual_seed(6))
    long[-1] = EOS
    sources = {0: long} | {k + 1: row[row != PAD] for k, row in enumerate(short)}
    replays: list = []
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in(replays))
    decoder = CapturedDecoder(model) if captured_steps else InFixedShapes(model)
    with torch.inference_mode():
        got, capacities = stream_outputs(decoder, sources)
    assert sorted(got) == list(sources)
    for k, row in sources.items():
        alone = greedy_hypotheses(
            model, row[None], SearchOptions(lenpen=0.6, max_len_a=1.5, max_len_b=4)
        )
        assert got[k].tokens == alone[0][0].tokens
        assert got[k].score == pytest.approx(alone[0][0].score, abs=1e-4)
    if captured_steps:
        record = decoder.record()
        assert record["replayed_steps"] == len(replays) == len(capacities)
        assert record["shapes"] <= len(set(capacities)) < len(capacities) / 2


@torch.inference_mode()
def test_free_slots_stepped_in_fixed_shapes_stay_within_the_columns():
    from mtkit.model.cache import SlotCache

    model, src = random_model(4), random_src(2, 5)
    memory, src_mask = model.encode(src)
    keys, values = model.cross_kv(memory)
    cache = SlotCache.empty(keys, 2, 4, src.size(1), fixed=True)
    cache.fill(torch.arange(2), (keys, values))
    token = torch.full((2,), 5)
    for _ in range(10):  # more steps than columns: free slots' positions stop at the last
        logits, cache = model.decode_step(token, None, src_mask, cache)
    assert cache.positions.tolist() == [3, 3] and torch.isfinite(logits).all()
    assert cache.shape == ("slots", 2, 4, src.size(1), torch.float32)


def test_a_servers_line_stream_replays_captured_steps_where_the_engine_takes_graphs(
    tiny_engine, monkeypatch
):
    from dataclasses import replace

    from mtkit.serving.stream import LineStream

    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in())
    engine = replace(tiny_engine, graphs=True)
    opts = SearchOptions(beam=1, max_len_a=0, max_len_b=6)
    lines = ["A dog runs.", "Two men are sitting.", "A cat.", ""]
    stream = LineStream(engine, opts)
    assert stream.search.fixed
    stream.add(lines[:2], [0, 1], opts)
    got = dict(stream.step())
    stream.add(lines[2:], [2, 3], opts)  # they join the running search
    while len(stream):
        got.update(stream.step())
    want = tiny_engine.translate(lines, opts)
    assert [[h.tokens for h in got[i]] for i in range(4)] == [[h.tokens for h in w] for w in want]
    assert engine.graph_record()["replayed_steps"] >= 6


def test_a_bad_cuda_graphs_choice_is_one_line_naming_the_option(trained):
    """Checked before anything loads, for a checkpoint and an exported folder alike."""
    from mtkit.engines.loader import load_engine

    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    with pytest.raises(OptionError, match=r"^--cuda-graphs must be auto, on or off, got 'yes'$"):
        load_engine(checkpoint, "cpu", cuda_graphs="yes")

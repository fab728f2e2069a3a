"""The CUDA paths (bf16 autocast, fused AdamW, translation on the GPU). Skipped without a
GPU; `benchmarks/gpu_check.sh` runs them with `-m cuda` wherever one is at hand."""

from __future__ import annotations

import json

import pytest
import torch
from scripted import stream_in_two_joins

from mtkit.core.config import config_from_dict
from mtkit.core.device import resolve_device
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS
from mtkit.engines.loader import load_engine
from mtkit.engines.session import Session
from mtkit.model.transformer import build_model
from mtkit.search.beam import greedy_hypotheses
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer
from mtkit.training.loop import train
from mtkit.tuning.precision import resolve_precision

from conftest import tiny_config_dict

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cuda_run(corpus, tmp_path_factory):
    """A tiny run trained for 30 steps on the GPU with precision auto."""
    run = tmp_path_factory.mktemp("cuda") / "run"
    cfg = config_from_dict(
        tiny_config_dict(
            corpus,
            run,
            train={"device": "auto", "precision": "auto", "max_steps": 30, "valid_every": 15},
        )
    )
    build_tokenizer(cfg)
    preprocess(cfg)
    return cfg, train(cfg)


def test_auto_picks_cuda_and_bf16_where_supported(cuda_run):
    cfg, result = cuda_run
    assert resolve_device("auto").type == "cuda"
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert resolve_precision("auto", torch.device("cuda"))[0] == (
        torch.bfloat16 if expected == "bf16" else None
    )
    assert result.precision == expected and result.step == 30
    lines = (cfg.run_path / "metrics.jsonl").read_text().splitlines()
    start = json.loads(lines[0])
    assert start["event"] == "start" and start["device"].startswith("cuda")
    assert start["precision"] == expected


def test_cached_decode_equals_full_decode_on_cuda_in_bf16():
    torch.manual_seed(0)
    cfg = config_from_dict(
        {
            "model": {
                "encoder_layers": 2,
                "decoder_layers": 2,
                "d_model": 64,
                "heads": 4,
                "ffn_dim": 128,
                "dropout": 0.0,
            }
        }
    ).model
    model = build_model(cfg, 50, 50).cuda().eval()
    src = torch.randint(4, 50, (3, 7), device="cuda")
    tgt = torch.randint(4, 50, (3, 6), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        memory, mask = model.encode(src)
        full = model.decode(tgt, memory, mask).float()  # (B, T, V)
        state = None
        for t in range(tgt.size(1)):
            step, state = model.decode_step(tgt[:, t], memory, mask, state)
            assert torch.allclose(step.float(), full[:, t], atol=0.1, rtol=0.05), t


def test_translation_on_cuda_gives_one_line_per_input(cuda_run):
    cfg, _ = cuda_run
    translator = load_engine(cfg.run_path / "checkpoints" / "last.pt", "cuda")
    assert translator.device.type == "cuda"
    assert translator.precision["attention"] == {"kernel": "matmul"}  # not cuDNN's plans
    lines = ["A dog runs in the park.", "", "Two men are talking."]
    out = [t.text for t in Session(translator, SearchOptions(beam=3)).translate_texts(lines)]
    assert len(out) == 3 and out[1] == "" and out[0]


def test_a_stream_runs_on_cuda_in_bf16_and_mostly_agrees_with_greedy_decoding():
    """bf16 rounding depends on the batch's shapes, so a near tie may go either way: most
    outputs, not all, must be those of batched greedy decoding."""
    torch.manual_seed(0)
    cfg = config_from_dict(
        {
            "model": {
                "encoder_layers": 2,
                "decoder_layers": 2,
                "d_model": 64,
                "heads": 4,
                "ffn_dim": 128,
                "dropout": 0.0,
            }
        }
    ).model
    model = build_model(cfg, 50, 50).cuda().eval()
    src = torch.randint(4, 50, (8, 7), device="cuda")
    src[:, -1] = EOS
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got, dtype = stream_in_two_joins(model, src, 1.0, 3)
        alone = greedy_hypotheses(model, src, SearchOptions(lenpen=0.6, max_len_a=1.0, max_len_b=3))
    assert dtype == torch.bfloat16  # the attention keys' dtype, not the memory's
    assert sorted(got) == list(range(8))
    assert all(len(got[k].tokens) <= 10 and torch.isfinite(torch.tensor(got[k].score)) for k in got)
    assert sum(got[k].tokens == alone[k][0].tokens for k in range(8)) >= 6


def test_every_decoding_option_runs_on_cuda_and_sampling_repeats(cuda_run):
    """Sampling, no-repeat n-grams, prefixes, alignments and a two-model ensemble in one
    search on the GPU; the seeded samples come out the same twice, and a line gets the
    same samples at another place in a batch. Not checked here: the same samples batched
    and alone. The GPU's kernels round differently for other batch shapes, and the
    30-step model's nearly flat distributions turn such last-bit differences into other
    draws; the CPU tests check that case."""
    cfg, _ = cuda_run
    last = cfg.run_path / "checkpoints" / "last.pt"
    pair = load_engine([last, last], "cuda")
    lines, prefixes = ["A dog runs in the park.", "", "Two men are talking."], ["Ein", "", ""]
    opts = SearchOptions(
        beam=3, nbest=3, sampling=True, topp=0.9, seed=3, no_repeat_ngram=2, alignments=True
    )
    first = pair.translate(lines, opts, prefixes=prefixes)
    again = pair.translate(lines, opts, prefixes=prefixes)
    assert [[h.tokens for h in x] for x in first] == [[h.tokens for h in x] for x in again]
    twice = pair.translate([lines[2], lines[0], lines[2]], opts)
    assert [h.tokens for h in twice[0]] == [h.tokens for h in twice[2]]
    assert len(first[0]) == 3 and first[1][0].tokens == []
    assert all(pair.tgt_vocab.decode(h.tokens).startswith("Ein") for h in first[0])
    assert all(h.alignment is not None for h in first[0])


def test_attention_and_batch_shapes_auto_measure_new_shapes_on_cuda(corpus, tmp_path):
    """The real device timers: attention auto records each kernel at a known and a new
    shape, and batch shapes auto the chosen kernel's (cuDNN builds a plan per shape)."""
    cfg = config_from_dict(
        tiny_config_dict(
            corpus,
            tmp_path / "run",
            train={
                "device": "cuda",
                "precision": "auto",
                "attention": "auto",
                "batch_shapes": "auto",
                "max_steps": 4,
                "valid_every": 4,
            },
        )
    )
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    start = json.loads((cfg.run_path / "metrics.jsonl").read_text().splitlines()[0])
    attention, batches = start["attention"], start["batches"]
    assert attention["kernel"] in ("sdpa", "matmul") and attention["asked"] == "auto"
    for key in ("sdpa_ms", "matmul_ms", "sdpa_new_shape_ms", "matmul_new_shape_ms"):
        assert attention[key] > 0, attention
    assert batches["shapes"] in ("exact", "classes") and batches["known_shape_ms"] > 0
    print(json.dumps({"attention": attention, "batches": batches}))


def test_the_fused_adamw_skips_a_non_finite_update_on_cuda():
    """What training's device-side skip rests on: `found_inf` leaves the weights, the
    moments and the step count as they were."""
    p = torch.nn.Parameter(torch.ones(8, device="cuda"))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    p.grad = torch.ones_like(p)
    opt.found_inf = torch.zeros((), device="cuda")
    opt.step()
    before = (p.detach().clone(), opt.state[p]["exp_avg"].clone(), float(opt.state[p]["step"]))
    p.grad = torch.full_like(p, float("nan"))
    opt.found_inf = torch.ones((), device="cuda")
    opt.step()
    assert torch.equal(p, before[0]) and torch.equal(opt.state[p]["exp_avg"], before[1])
    assert float(opt.state[p]["step"]) == before[2] == 1.0


def test_captured_updates_on_cuda_train_as_eager_ones(corpus, tmp_path):
    """The real capture (`torch.cuda.graph`): every update of the run replayed by its
    shape's graph, and the weights those of eager updates, within float tolerance (the
    dense loss sums in another order; dropout 0, so no mask depends on the RNG's use)."""
    runs = {}
    for name, graphs in (("eager", "off"), ("graphs", "on")):
        cfg = config_from_dict(
            tiny_config_dict(
                corpus,
                tmp_path / name,
                train={
                    "device": "cuda",
                    "precision": "fp32",
                    "cuda_graphs": graphs,
                    "batch_shapes": "classes",
                    "max_steps": 12,
                    "valid_every": 12,
                    "log_every": 4,
                },
            )
        )
        build_tokenizer(cfg)
        preprocess(cfg)
        train(cfg)
        runs[name] = cfg.run_path
    records = [json.loads(x) for x in (runs["graphs"] / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["graphs"]["graphs"] == "on"
    assert [r["captured_updates"] for r in records if r["event"] == "train"] == ["4/4"] * 3
    assert not [r for r in records if r["event"] == "graph_fallback"]
    from mtkit.core.checkpoint import load_checkpoint

    a, b = (load_checkpoint(runs[n] / "checkpoints" / "last.pt")["model"] for n in runs)
    for name in a:
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-4, msg=name)


def test_cuda_graphs_auto_times_both_kinds_of_update(corpus, tmp_path):
    cfg = config_from_dict(
        tiny_config_dict(
            corpus,
            tmp_path / "run",
            train={"device": "cuda", "precision": "auto", "cuda_graphs": "auto", "max_steps": 8},
        )
    )
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    start = json.loads((cfg.run_path / "metrics.jsonl").read_text().splitlines()[0])
    graphs = start["graphs"]
    assert graphs["asked"] == "auto" and graphs["eager_ms"] > 0 and graphs["graph_ms"] > 0
    assert graphs["graphs"] == ("on" if graphs["graph_ms"] <= 0.9 * graphs["eager_ms"] else "off")
    print(json.dumps({"graphs": graphs}))


def test_beam_search_reading_done_sentences_every_few_steps_on_cuda_gives_the_same_tokens():
    """On CUDA the host reads which sentences are done every `READ_EVERY_ON_GPU` steps:
    the same hypotheses as reading each step, on the same device."""
    from scripted import random_model, random_src

    from mtkit.search.beam import beam_search

    from conftest import assert_same_hypotheses

    model, src = random_model(5).cuda(), random_src(16, 4).cuda()
    for options in (SearchOptions(beam=5, nbest=2), SearchOptions(beam=4, max_len_b=10**6)):
        assert_same_hypotheses(
            beam_search(model, src, options), beam_search(model, src, options, read_every=1)
        )


def test_captured_decoder_steps_on_cuda_replay_the_search_in_fixed_shapes():
    """Graph replays run the kernels of the fixed-shape eager search: the same tokens
    (the slot's buffers may be laid out otherwise than the search's, so scores only
    within rounding), in fp32 and bf16. In fp32 they are also today's eager search's
    tokens (attention over the masked columns of a preallocated cache only rounds
    differently)."""
    from scripted import InFixedShapes, random_model, random_src

    from mtkit.core.device import autocast
    from mtkit.search.beam import beam_search
    from mtkit.search.captured import CapturedDecoder

    from conftest import assert_same_hypotheses

    model, src = random_model(5).cuda(), random_src(16, 4).cuda()
    cuda = torch.device("cuda")
    for dtype in (None, torch.bfloat16):
        decoder = CapturedDecoder(model)
        with torch.inference_mode(), autocast(cuda, dtype):
            for options in (SearchOptions(beam=5, nbest=2), SearchOptions(beam=4, max_len_b=10**6)):
                got = beam_search(decoder, src, options)
                fixed = beam_search(InFixedShapes(model), src, options)
                assert_same_hypotheses(got, fixed)
                if dtype is None:
                    assert_same_hypotheses(got, beam_search(model, src, options))
            greedy = greedy_hypotheses(decoder, src, SearchOptions(max_len_b=30))
            fixed = greedy_hypotheses(InFixedShapes(model), src, SearchOptions(max_len_b=30))
            assert [x[0].tokens for x in greedy] == [x[0].tokens for x in fixed]
        record = decoder.record()
        print(json.dumps({"captured_decoder": record, "dtype": str(dtype)}))
        assert record["failed"] == 0 and record["replayed_steps"] > 10 * record["eager_steps"]


def test_the_engine_decodes_with_cuda_graphs_and_a_budget_sized_for_the_gpu(
    cuda_run, corpus, tmp_path
):
    """decode.cuda_graphs on: translation replays captured steps (bf16: most outputs as
    the eager engine's, near ties may round the other way), with a batch budget sized
    for the GPU's memory; a training's validation decodes through captured steps too."""
    import shutil

    cfg, _ = cuda_run
    last = cfg.run_path / "checkpoints" / "last.pt"
    graphs = load_engine(last, "cuda", cuda_graphs="on")
    eager = load_engine(last, "cuda", cuda_graphs="off")
    assert graphs.precision["graphs"] == {"graphs": "on", "asked": "on"}
    assert graphs.batch_tokens > 8000 and graphs.precision["batch_tokens"]["free_gb"] > 0
    lines = corpus["test.en"].read_text().splitlines()[:100]
    for options in (SearchOptions(beam=5, nbest=2), SearchOptions(beam=1)):
        got, want = graphs.translate(lines, options), eager.translate(lines, options)
        same = sum(g.tokens == w.tokens for x, y in zip(got, want) for g, w in zip(x, y))
        assert same >= 0.9 * sum(len(x) for x in want)
    record = graphs.graph_record()
    print(json.dumps({"engine_graphs": record, "batch_tokens": graphs.precision["batch_tokens"]}))
    assert record["failed"] == 0 and record["replayed_steps"] > 0

    run = tmp_path / "run"
    shutil.copytree(
        cfg.run_path, run, ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl", ".lock")
    )
    train(
        config_from_dict(
            tiny_config_dict(
                corpus,
                run,
                train={"device": "cuda", "precision": "auto", "max_steps": 30, "valid_every": 15},
                decode={"cuda_graphs": "on"},
            )
        )
    )
    events = [json.loads(x)["event"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert events.count("valid") == 2


def test_a_servers_stream_replays_captured_steps_on_cuda(cuda_run, corpus):
    """`mtkit serve`'s continuous batching with decode.cuda_graphs on: lines joining a
    running stream in fixed shapes get (mostly: bf16 near ties) the engine's greedy
    outputs, each step a replay."""
    from mtkit.serving.stream import LineStream

    cfg, _ = cuda_run
    engine = load_engine(cfg.run_path / "checkpoints" / "last.pt", "cuda", cuda_graphs="on")
    opts = SearchOptions(beam=1)
    lines = corpus["test.en"].read_text().splitlines()[:40]
    stream, got = LineStream(engine, opts), {}
    for start in range(0, 40, 8):  # 8 lines join at each step
        stream.add(lines[start : start + 8], list(range(start, start + 8)), opts)
        got.update(stream.step())
    while len(stream):
        got.update(stream.step())
    want = engine.translate(lines, opts)
    same = sum(got[i][0].tokens == want[i][0].tokens for i in range(40))
    record = engine.graph_record()
    print(json.dumps({"stream_graphs": record, "identical": same}))
    assert same >= 36 and record["failed"] == 0 and record["replayed_steps"] > 0


def test_captured_validation_steps_read_the_weights_of_each_validation():
    """Validation decodes under no_grad and bf16 autocast with weights that require
    grad, whose casts autocast caches for the batch's loss and frees after it: a graph
    must record its own casts. After the weights change in place (an optimizer step),
    the replays follow them."""
    from scripted import InFixedShapes, random_model, random_src

    from mtkit.core.device import autocast
    from mtkit.search.captured import CapturedDecoder

    model, src = random_model(5).cuda(), random_src(16, 4).cuda()
    decoder, cuda = CapturedDecoder(model), torch.device("cuda")
    for _ in range(2):
        with torch.no_grad():
            with autocast(cuda, torch.bfloat16):
                model(src, src)  # the loss's forward: autocast caches the weights' casts
                got = greedy_hypotheses(decoder, src, SearchOptions(max_len_b=20))
            with autocast(cuda, torch.bfloat16):
                want = greedy_hypotheses(InFixedShapes(model), src, SearchOptions(max_len_b=20))
            for p in model.parameters():  # an optimizer step, in place
                p.mul_(1.5)
        assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    assert decoder.record()["replayed_steps"] > 0 and decoder.record()["failed"] == 0

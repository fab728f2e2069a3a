"""The engines' shared behaviour (`mtkit.engines`): beam 1 is greedy, overlong input is
truncated with one warning."""

from __future__ import annotations

import logging
import math

import pytest
from scripted import A, B, C, Scripted

from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS
from mtkit.engines.pytorch import TorchEngine
from mtkit.search.beam import length_penalty

from conftest import inference_mode_watched


def test_beam_one_is_greedy_decoding(tiny_engine):
    # eos is the argmax after A, but A B C A eos scores better under a strong length
    # penalty: a search with a beam of one would go on to it; greedy stops at its eos.
    table = {
        (): {A: 1.0},
        (A,): {EOS: 0.6, B: 0.4},
        (A, B): {C: 1.0},
        (A, B, C): {A: 1.0},
        (A, B, C, A): {EOS: 1.0},
    }

    class ScriptedTranslator(TorchEngine):
        step_model = Scripted(table)

    scripted = ScriptedTranslator(
        tiny_engine.models,
        tiny_engine.src_vocab,
        tiny_engine.tgt_vocab,
        tiny_engine.device,
        None,
        tiny_engine.config,
    )
    (hyp,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=1, lenpen=2.0))
    assert hyp.tokens == [A]
    assert hyp.score == pytest.approx(math.log(0.6) / length_penalty(2, 2.0))
    (longer,), _ = scripted.translate(["A dog.", ""], SearchOptions(beam=2, lenpen=2.0))
    assert longer.tokens == [A, B, C, A]


def test_overlong_lines_are_truncated_with_one_warning(tiny_engine, caplog):
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 10)
    opts = SearchOptions(beam=2, max_len_a=0.0, max_len_b=5)
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        out = tiny_engine.translate([long, long, "A dog."], opts)
        tiny_engine.translate([long], opts)
    assert len(out) == 3 and all(len(h) == 1 for h in out)
    warnings = [r for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "input lines longer than 23 subwords" in warnings[0].getMessage()
    # A target prefix is cut too, leaving room for eos, with a warning of its own.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mtkit.engines.base"):
        (hyp,) = tiny_engine.translate(["A dog."], opts, prefixes=[long])[0]
    cut = tiny_engine.tgt_vocab.encode([long])[0][:22]
    assert hyp.tokens[:22] == cut and len(hyp.tokens) <= 23  # within the positions
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "target prefixes longer than 22 subwords are truncated"
    ]


def test_translation_precision_auto_measures_forward_only_and_fp32_is_kept_when_asked(
    monkeypatch, caplog
):
    import torch

    import mtkit.tuning.precision as precision_module
    from mtkit.core.config import Config
    from mtkit.core.errors import OptionError
    from mtkit.tuning.precision import Calibration, inference_precision

    seen = []

    def faked(rows, d_in, d_out, backward=True):
        seen.append((rows, d_in, d_out, backward))
        return Calibration(fp32_s=0.004, bf16_s=0.001)

    monkeypatch.setattr(precision_module, "calibrate_cpu", faked)
    cpu = torch.device("cpu")
    with caplog.at_level("DEBUG", logger="mtkit.tuning.precision"):  # (-v: stderr is for errors)
        dtype, record = inference_precision("auto", cpu, Config())
    assert dtype == torch.bfloat16 and record == {
        "precision": "bf16",
        "asked": "auto",
        "calibration": {"fp32_ms": 4.0, "bf16_ms": 1.0},
    }
    assert seen == [(500, 512, 2048, False)] and "Linear, forward, took" in caplog.text
    assert inference_precision("fp32", cpu, Config()) == (
        None,
        {"precision": "fp32", "asked": "fp32"},
    )
    monkeypatch.setattr(
        precision_module, "calibrate_cpu", lambda *a, **k: Calibration(fp32_s=0.004, bf16_s=0.0038)
    )
    assert inference_precision("auto", cpu, Config())[0] is None  # not clearly faster
    with pytest.raises(OptionError, match=r"--precision must be auto, fp32, bf16 or int8"):
        inference_precision("fp16", cpu, Config())


def test_int8_is_taken_only_when_asked_and_only_on_a_cpu_whose_torch_has_it(monkeypatch, caplog):
    import torch

    from mtkit.core.config import Config
    from mtkit.core.errors import OptionError
    from mtkit.model import int8
    from mtkit.tuning.precision import inference_precision

    cpu = torch.device("cpu")
    monkeypatch.setattr(int8, "int8_supported", lambda: True)
    # the weight range found exact on this CPU is recorded, and said where it is reduced
    monkeypatch.setattr(int8, "weight_range", lambda: 127)
    with caplog.at_level(logging.INFO, logger="mtkit"):
        assert inference_precision("int8", cpu, Config()) == (
            None,
            {"precision": "int8", "asked": "int8", "int8_weight_range": 127},
        )
    assert "weights are rounded" not in caplog.text
    monkeypatch.setattr(int8, "weight_range", lambda: 63)
    with caplog.at_level(logging.INFO, logger="mtkit"):
        assert inference_precision("int8", cpu, Config())[1]["int8_weight_range"] == 63
    assert (
        "not exact on this CPU (no VNNI instructions): weights are rounded to -63..63"
        in caplog.text
    )
    with pytest.raises(OptionError, match=r"^--precision int8 runs on a CPU; on CUDA use "):
        inference_precision("int8", torch.device("cuda"), Config())
    monkeypatch.setattr(int8, "int8_supported", lambda: False)
    with pytest.raises(OptionError, match=r"^--precision int8 needs int8 matrix products"):
        inference_precision("int8", cpu, Config())


def test_an_engine_in_bf16_translates_and_says_so(tiny_engine):
    import dataclasses

    import torch

    bf16 = dataclasses.replace(
        tiny_engine, autocast_dtype=torch.bfloat16, precision={"precision": "bf16", "asked": "bf16"}
    )
    ((hyp,),) = bf16.translate(["A dog runs."], SearchOptions(beam=2, max_len_a=0, max_len_b=4))
    assert 1 <= len(hyp.tokens) <= 4 and bf16.describe()["precision"] == "bf16"
    assert tiny_engine.describe()["precision"] == "fp32"


def test_bf16_weights_casts_every_float_tensor_once_and_hands_back_the_fp32_ones():
    import torch

    from mtkit.core.config import ModelConfig
    from mtkit.engines.pytorch_precision import bf16_weights
    from mtkit.model.transformer import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=16,
        heads=2,
        ffn_dim=32,
        dropout=0.0,
        max_positions=24,
    )
    model = build_model(cfg, 50, 50).eval()
    # A second module holding the same weight: it must stay one tensor, cast once.
    model.decoder_layers[0].ffn.outer.weight = model.encoder_layers[0].ffn.outer.weight
    floats = {
        id(t): t.data_ptr()
        for t in (*model.parameters(), *model.buffers())
        if t.is_floating_point()
    }  # distinct tensors (parameters() drops repeats)
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    reference = model.decode(tgt, *model.encode(src))  # (1, 3, V) fp32
    handed = []
    assert bf16_weights(model, handed.append) is model
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.decoder_layers[0].ffn.outer.weight is model.encoder_layers[0].ffn.outer.weight
    assert model.tgt_embed.sinusoidal.dtype == torch.bfloat16  # buffers too
    assert len(handed) == len(floats)  # each distinct fp32 tensor once
    assert all(t.dtype == torch.float32 for t in handed)
    assert sorted(t.data_ptr() for t in handed) == sorted(floats.values())  # the fp32 storage
    out = model.decode(tgt, *model.encode(src))
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), reference, atol=0.1, rtol=0.05)


def test_a_bf16_engine_on_a_cpu_runs_bf16_weights_without_autocast(trained):
    import torch

    from mtkit.engines.pytorch_loading import load_torch_engine

    engine = load_torch_engine(
        [trained / "run" / "checkpoints" / "best.pt"], "cpu", precision="bf16"
    )
    assert engine.autocast_dtype is None and engine.precision["precision"] == "bf16"
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    fp32 = load_torch_engine([trained / "run" / "checkpoints" / "best.pt"], "cpu", precision="fp32")
    assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}
    opts = SearchOptions(beam=3, max_len_a=0, max_len_b=6, nbest=3)
    lines = ["A dog runs.", "Two men are sitting on a bench."]
    bf16_hyps, fp32_hyps = engine.translate(lines, opts), fp32.translate(lines, opts)
    for ours, theirs in zip(bf16_hyps, fp32_hyps, strict=True):
        assert 1 <= len(ours[0].tokens) <= 6 and math.isfinite(ours[0].log_prob)
        # the same model in another precision: its best scores about what fp32's does
        assert abs(ours[0].log_prob - theirs[0].log_prob) < 0.5


def test_an_engines_layers_keep_their_stacked_weights(trained):
    """The engine marks its models' weights final: after a translation each stacked
    product (self-attention's queries/keys/values, the decoder's cross keys/values)
    holds its stack, and a second translation gives the same outputs with it."""
    from mtkit.engines.pytorch_loading import load_torch_engine

    engine = load_torch_engine(
        [trained / "run" / "checkpoints" / "best.pt"], "cpu", precision="fp32"
    )
    opts = SearchOptions(beam=3, max_len_a=0, max_len_b=6)
    lines = ["A dog runs.", "Two men are sitting on a bench."]
    first = engine.translate(lines, opts)
    layer = engine.model.decoder_layers[0]
    assert layer.self_attn.q_proj._stacked is not None  # queries, keys, values
    assert layer.cross_attn.k_proj._stacked is not None  # all layers' cross keys/values
    stack = layer.self_attn.q_proj._stacked.product
    assert engine.translate(lines, opts) == first
    assert layer.self_attn.q_proj._stacked.product is stack  # kept, not made again


@pytest.mark.parametrize("beam", [1, 2])
def test_an_engines_searches_run_in_inference_mode(tiny_engine, beam):
    """No autograd records in a translation's steps (faster small operations), and
    the search's outputs are unchanged by it."""
    import torch

    watched, seen = inference_mode_watched(tiny_engine)
    opts = SearchOptions(beam=beam, max_len_a=0, max_len_b=5)
    out = watched.translate(["A dog runs.", "Two men."], opts)
    assert seen and all(seen)
    assert not torch.is_inference_mode_enabled()
    assert out == tiny_engine.translate(["A dog runs.", "Two men."], opts)

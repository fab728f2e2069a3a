"""The attention kernel (`mtkit.model.attention.matmul_attention` beside SDPA) and how a run
chooses it (`mtkit.tuning.attention`, `mtkit.tuning.shapes`), with faked timings."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from mtkit.core.config import ModelConfig
from mtkit.model.attention import matmul_attention
from mtkit.model.transformer import build_model
from mtkit.tuning.attention import AttentionShape, choose_attention, time_attention
from mtkit.tuning.shapes import choose_batch_shapes


@pytest.mark.parametrize("causal, masked", [(False, True), (True, False), (True, True)])
def test_matmul_attention_computes_what_sdpa_computes(causal, masked):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8) for _ in range(3))
    mask = (torch.arange(7)[None, :] < torch.tensor([7, 5, 3])[:, None])[:, None, None, :]
    mask = mask if masked else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    got = matmul_attention(q, k, v, mask, causal)
    assert torch.allclose(got, expected, atol=1e-6)


def test_a_model_translates_the_same_with_either_kernel():
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0
    )
    model = build_model(cfg, 50, 50).eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = torch.tensor([[2, 10, 11], [2, 12, 0]])
    with torch.no_grad():
        sdpa = model.decode(tgt, *model.encode(src))
        model.use_attention("matmul")
        matmul = model.decode(tgt, *model.encode(src))
    assert torch.allclose(matmul, sdpa, atol=1e-5)
    assert {m.kernel for m in model.modules() if hasattr(m, "kernel")} == {"matmul"}
    with pytest.raises(ValueError, match="attention kernel must be one of"):
        model.use_attention("flash")


def test_dropout_on_the_weights_keeps_the_expected_value():
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 2, 6, 4) for _ in range(3))
    plain = matmul_attention(q, k, v, None, False)
    dropped = torch.stack([matmul_attention(q, k, v, None, False, p=0.5) for _ in range(200)]).mean(
        0
    )
    assert (dropped - plain).abs().mean() < 0.05  # inverted dropout: unbiased


def faked(sdpa_ms: float, matmul_ms: float):
    calls = []

    def measure(kernel: str) -> float:
        calls.append(kernel)
        return (sdpa_ms if kernel == "sdpa" else matmul_ms) / 1000

    return measure, calls


SHAPE = AttentionShape.of_run(max_tokens=4096, mean_length=15.6, d_model=256, heads=4)


def test_auto_takes_matmul_only_where_it_is_clearly_faster(caplog):
    assert (SHAPE.length, SHAPE.batch, SHAPE.head_dim) == (16, 256, 64)
    measure, calls = faked(sdpa_ms=2.0, matmul_ms=1.4)
    with caplog.at_level("INFO", logger="mtkit.tuning"):
        record = choose_attention("auto", torch.device("cpu"), torch.bfloat16, SHAPE, measure)
    assert record == {"kernel": "matmul", "asked": "auto", "sdpa_ms": 2.0, "matmul_ms": 1.4}
    assert (
        "2.00 ms with SDPA and 1.40 ms with matmul + softmax on this CPU: matmul" in caplog.text
        and "in bf16" in caplog.text
    )
    assert calls.count("sdpa") == calls.count("matmul") > 2  # warmed up, then interleaved
    close, _ = faked(sdpa_ms=2.0, matmul_ms=1.9)  # within the margin: SDPA stays
    assert choose_attention("auto", torch.device("cpu"), None, SHAPE, close)["kernel"] == "sdpa"


def test_a_kernel_asked_for_is_not_measured():
    measure, calls = faked(2.0, 1.0)
    assert choose_attention("sdpa", torch.device("cpu"), None, SHAPE, measure) == {
        "kernel": "sdpa",
        "asked": "sdpa",
    }
    assert (
        choose_attention("matmul", torch.device("cpu"), None, SHAPE, measure)["kernel"] == "matmul"
    )
    assert choose_attention("sdpa", torch.device("cuda"), None, SHAPE, measure) == {
        "kernel": "sdpa",
        "asked": "sdpa",
    }
    assert calls == []


def faked_kernel_shapes(**ms: tuple[float, float]):
    """Kernels whose first call at a length costs ms[kernel][0], later ones ms[kernel][1]."""
    seen, calls = set(), []

    def measure(kernel: str, extra: int) -> float:
        calls.append((kernel, extra))
        new, known = ms[kernel]
        cost = known if (kernel, extra) in seen else new
        seen.add((kernel, extra))
        return cost / 1000

    return measure, calls


def test_on_cuda_auto_takes_a_kernel_whose_new_shapes_cost_little(caplog):
    # cuDNN's SDPA: fast at a known shape, 60x that at a new one (it builds a plan).
    measure, calls = faked_kernel_shapes(sdpa=(30.0, 0.5), matmul=(0.9, 0.8))
    cuda = torch.device("cuda")
    with caplog.at_level("INFO", logger="mtkit.tuning"):
        record = choose_attention("auto", cuda, torch.bfloat16, SHAPE, measure)
    assert record == {
        "kernel": "matmul",
        "asked": "auto",
        "sdpa_ms": 0.5,
        "matmul_ms": 0.8,
        "sdpa_new_shape_ms": 30.0,
        "matmul_new_shape_ms": 0.9,
    }
    assert "SDPA 0.50 ms (30.00 ms at a new shape), matmul + softmax 0.80 ms" in caplog.text
    fresh = {kernel: [e for k, e in calls if k == kernel and e] for kernel in ("sdpa", "matmul")}
    # Three first calls each, at lengths never timed before; the rest at the run's own.
    assert all(len(set(e)) == len(e) == 3 for e in fresh.values())
    assert not set(fresh["sdpa"]) & set(fresh["matmul"])
    # Both stable: matmul only where clearly faster, as on a CPU.
    stable, _ = faked_kernel_shapes(sdpa=(1.0, 0.9), matmul=(0.9, 0.85))
    assert choose_attention("auto", cuda, None, SHAPE, stable)["kernel"] == "sdpa"
    faster, _ = faked_kernel_shapes(sdpa=(1.0, 0.9), matmul=(0.7, 0.6))
    assert choose_attention("auto", cuda, None, SHAPE, faster)["kernel"] == "matmul"
    # Neither stable: the faster at a known shape (batches in few shapes then help).
    neither, _ = faked_kernel_shapes(sdpa=(9.0, 0.5), matmul=(9.0, 0.8))
    assert choose_attention("auto", cuda, None, SHAPE, neither)["kernel"] == "sdpa"
    only_sdpa, _ = faked_kernel_shapes(sdpa=(0.6, 0.5), matmul=(9.0, 0.3))
    assert choose_attention("auto", cuda, None, SHAPE, only_sdpa)["kernel"] == "sdpa"


def test_the_fastest_run_of_each_kernel_counts_so_load_does_not_decide():
    """A burst of load on some runs (either kernel) does not change the figures."""
    times = {
        "sdpa": iter([9.0, 9.0, 2.0, 50.0, 2.0, 2.0, 30.0, 2.0, 2.0]),
        "matmul": iter([9.0, 9.0, 40.0, 1.0, 1.0, 1.0, 1.0, 45.0, 1.0]),
    }
    timing = time_attention(lambda kernel: next(times[kernel]) / 1000)
    assert dataclasses.astuple(timing) == (0.002, 0.001)


def faked_shapes(new_ms: float, known_ms: float):
    """A Linear whose first call at a number of rows costs new_ms, later ones known_ms."""
    seen, calls = set(), []

    def measure(n: int) -> float:
        calls.append(n)
        cost = known_ms if n in seen else new_ms
        seen.add(n)
        return cost / 1000

    return measure, calls


def test_batch_shapes_auto_takes_classes_where_a_new_shape_costs_twice_a_known_one(caplog):
    measure, calls = faked_shapes(new_ms=6.0, known_ms=1.0)
    with caplog.at_level("INFO", logger="mtkit.tuning"):
        record = choose_batch_shapes(
            "auto",
            torch.device("cpu"),
            torch.bfloat16,
            (635, 256, 1024),
            fresh_above=1024,
            measure=measure,
        )
    assert record == {
        "shapes": "classes",
        "asked": "auto",
        "new_shape_ms": 6.0,
        "known_shape_ms": 1.0,
    }
    assert (
        "took 6.00 ms at a new shape and 1.00 ms at a known one on this CPU: batches "
        "in few shapes" in caplog.text
    )
    fresh = [n for n in calls if n != 635]
    # Three row counts above any a batch of 1,024 tokens can have, each new then known.
    assert len(fresh) == 9 and len(set(fresh)) == 3 and min(fresh) > 1024
    assert fresh[0::3] == fresh[1::3] == fresh[2::3]
    cheap, more = faked_shapes(new_ms=1.5, known_ms=1.0)  # under 2x: token batches stay
    assert (
        choose_batch_shapes(
            "auto",
            torch.device("cpu"),
            torch.bfloat16,
            (635, 256, 1024),
            fresh_above=1024,
            measure=cheap,
        )["shapes"]
        == "exact"
    )
    assert not set(more) - {635} & set(fresh)  # measuring again in the process: new rows


def test_batch_shapes_are_measured_in_bf16_on_a_cpu_and_in_any_precision_on_cuda(caplog):
    measure, calls = faked_shapes(new_ms=9.0, known_ms=1.0)
    shape = (635, 256, 1024)
    assert choose_batch_shapes("auto", torch.device("cpu"), None, shape, measure=measure) == {
        "shapes": "exact",
        "asked": "auto",
    }  # fp32 on a CPU: no kernel is compiled per shape
    assert choose_batch_shapes("classes", torch.device("cpu"), None, shape, measure=measure) == {
        "shapes": "classes",
        "asked": "classes",
    }
    assert calls == []
    with caplog.at_level("INFO", logger="mtkit.tuning"):
        for dtype in (None, torch.bfloat16):
            record = choose_batch_shapes(
                "auto",
                torch.device("cuda"),
                dtype,
                shape,
                measure=measure,
                attention=("sdpa", SHAPE),
            )
            assert record["shapes"] == "classes" and record["new_shape_ms"] == 9.0
    assert (
        "the run's attention (sdpa)" in caplog.text and "on this GPU: batches in few" in caplog.text
    )
    cheap, _ = faked_shapes(new_ms=1.2, known_ms=1.0)
    assert (
        choose_batch_shapes("auto", torch.device("cuda"), None, shape, measure=cheap)["shapes"]
        == "exact"
    )


def test_the_real_shape_timer_gives_a_record_with_both_figures():
    record = choose_batch_shapes(
        "auto", torch.device("cpu"), torch.bfloat16, (64, 32, 64), fresh_above=64
    )
    assert record["shapes"] in ("exact", "classes") and record["asked"] == "auto"
    assert record["new_shape_ms"] > 0 and record["known_shape_ms"] > 0
    ratio = record["new_shape_ms"] / record["known_shape_ms"]
    if abs(ratio - 2) > 0.05:  # (the record's figures are rounded)
        assert (record["shapes"] == "classes") == (ratio > 2)


def test_translation_takes_matmul_attention_only_where_a_decoding_step_is_faster(caplog):
    from mtkit.tuning.attention import choose_decoding_attention

    measure, calls = faked(sdpa_ms=6.6, matmul_ms=1.9)
    with caplog.at_level("DEBUG", logger="mtkit.tuning"):
        record = choose_decoding_attention(torch.device("cpu"), torch.bfloat16, SHAPE, measure)
    assert record == {"kernel": "matmul", "sdpa_ms": 6.6, "matmul_ms": 1.9}
    assert "attention for translation" in caplog.text and "in bf16" in caplog.text
    assert calls.count("sdpa") == calls.count("matmul") > 2
    close, _ = faked(sdpa_ms=2.0, matmul_ms=1.9)
    assert choose_decoding_attention(torch.device("cpu"), None, SHAPE, close) == {
        "kernel": "sdpa",
        "sdpa_ms": 2.0,
        "matmul_ms": 1.9,
    }
    untouched, calls = faked(1.0, 2.0)  # on CUDA, matmul unmeasured (cuDNN's plans)
    assert (
        choose_decoding_attention(torch.device("cuda"), None, SHAPE, untouched)
        == {"kernel": "matmul"}
        and calls == []
    )


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_real_decoding_attention_timer_runs_both_kernels(dtype):
    from mtkit.tuning.attention import decoding_attention_timer

    once = decoding_attention_timer(AttentionShape(20, 7, 2, 8), dtype)
    assert once("sdpa") > 0 and once("matmul") > 0


def test_a_loaded_engine_attends_with_the_kernel_it_measured(trained, monkeypatch):
    from mtkit.engines.pytorch_loading import load_torch_engine
    from mtkit.model.attention import MultiHeadAttention

    timed = []  # the precision each choice was measured in

    def take(kernel):
        def choose(device, dtype, shape, measure=None):
            timed.append(dtype)
            return {"kernel": kernel}

        return choose

    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    for kernel, precision in (("matmul", "bf16"), ("sdpa", "fp32")):
        monkeypatch.setattr("mtkit.tuning.attention.choose_decoding_attention", take(kernel))
        engine = load_torch_engine([checkpoint], "cpu", precision=precision)
        assert engine.precision["attention"] == {"kernel": kernel}
        assert {m.kernel for m in engine.model.modules() if isinstance(m, MultiHeadAttention)} == {
            kernel
        }
    assert timed == [torch.bfloat16, None]  # measured as each engine runs


def test_a_measurement_that_fails_on_cuda_keeps_what_mtkit_did_before_measuring(caplog):
    def failing(*args):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    cuda = torch.device("cuda")
    with caplog.at_level("WARNING", logger="mtkit.tuning"):
        record = choose_attention("auto", cuda, torch.bfloat16, SHAPE, failing)
    assert record["kernel"] == "sdpa" and "CUDNN_STATUS_NOT_SUPPORTED" in record["failed"]
    assert "measuring on cuda failed" in caplog.text

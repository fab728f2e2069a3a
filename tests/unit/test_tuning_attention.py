"""How a run and a translation choose the attention kernel (`mtkit.tuning.attention`), with
faked timings, and a loaded engine attending with the kernel it measured."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mtkit.tuning.attention import AttentionShape, choose_attention, time_attention


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

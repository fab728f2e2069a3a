"""Choices measured on this machine and kept (`mtkit.core.measured`): a later process
takes the first process's choice, so that it translates the same input the same way."""

from __future__ import annotations

import json

import pytest
import torch

from mtkit.core import measured
from mtkit.core.measured import remembered
from mtkit.model import kernel_timing
from mtkit.model.kernel_timing import AttentionShape, choose_decoding_attention


@pytest.fixture
def kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / measured.FILE


def counting(record: dict):
    calls = []

    def measure():
        calls.append(1)
        return dict(record)

    return measure, calls


def test_a_choice_is_measured_once_and_then_kept(kept):
    measure, calls = counting({"kernel": "matmul", "matmul_ms": 1.0})
    assert remembered("attention", {"rows": 500}, measure) == {"kernel": "matmul", "matmul_ms": 1.0}
    other, other_calls = counting({"kernel": "sdpa"})  # a later process would measure this
    assert remembered("attention", {"rows": 500}, other) == {"kernel": "matmul", "matmul_ms": 1.0}
    assert calls == [1] and other_calls == []
    assert remembered("attention", {"rows": 600}, other) == {"kernel": "sdpa"}  # another key
    assert remembered("precision", {"rows": 500}, other) == {"kernel": "sdpa"}  # another kind
    assert len(json.loads(kept.read_text())) == 3


def test_an_unreadable_or_unwritable_cache_measures_every_time(kept, tmp_path, monkeypatch):
    kept.parent.mkdir(parents=True)
    kept.write_text("{not json")
    measure, calls = counting({"kernel": "sdpa"})
    assert remembered("attention", {}, measure) == {"kernel": "sdpa"}  # and rewrites it
    assert json.loads(kept.read_text()) == {"attention {}": {"kernel": "sdpa"}}
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(blocker / "cache"))  # cannot be made
    assert remembered("attention", {}, measure) == {"kernel": "sdpa"}
    assert remembered("attention", {}, measure) == {"kernel": "sdpa"}
    assert len(calls) == 3


def test_an_empty_cache_dir_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("MTKIT_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measure, calls = counting({"kernel": "sdpa"})
    remembered("attention", {}, measure)
    remembered("attention", {}, measure)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_the_default_place_is_xdgs_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("MTKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert measured.cache_dir() == tmp_path / "mtkit"


def test_translations_attention_kernel_is_the_first_measurement_on_this_machine(kept, monkeypatch):
    """Two processes' timings on either side of the margin: the second takes the first's
    kernel (a test's own `measure` is never kept)."""
    shape = AttentionShape(batch=8, length=5, heads=2, head_dim=4)
    timings = iter([{"sdpa": 1.0, "matmul": 0.5}, {"sdpa": 0.5, "matmul": 1.0}])

    def timer(shape, dtype):  # each process's real timer
        times = next(timings)
        return lambda kernel: times[kernel]

    monkeypatch.setattr(kernel_timing, "decoding_attention_timer", timer)
    cpu = torch.device("cpu")
    first = choose_decoding_attention(cpu, None, shape)
    assert first["kernel"] == "matmul"
    assert choose_decoding_attention(cpu, None, shape) == first  # not measured again
    assert choose_decoding_attention(cpu, torch.bfloat16, shape)["kernel"] == "sdpa"  # new key
    fake = choose_decoding_attention(cpu, None, shape, lambda k: {"sdpa": 1, "matmul": 2}[k])
    assert fake["kernel"] == "sdpa"  # measured as given, not the kept one


def test_translations_precision_auto_is_the_first_measurement_on_this_machine(kept, monkeypatch):
    from mtkit.core.config import Config
    from mtkit.core.device import Calibration
    from mtkit.engines import pytorch

    answers = iter([(torch.bfloat16, Calibration(2.0, 1.0)), (None, Calibration(1.0, 2.0))])
    monkeypatch.setattr(  # auto measures (the first answer, then the other), fp32 does not
        pytorch,
        "resolve_precision",
        lambda asked, *args, **kwargs: next(answers) if asked == "auto" else (None, None),
    )
    cpu = torch.device("cpu")
    dtype, record = pytorch.inference_precision("auto", cpu, Config())
    assert dtype is torch.bfloat16 and record["calibration"] == {
        "fp32_ms": 2000.0,
        "bf16_ms": 1000.0,
    }
    assert pytorch.inference_precision("auto", cpu, Config()) == (dtype, record)  # kept
    assert pytorch.inference_precision("fp32", cpu, Config()) == (
        None,
        {"precision": "fp32", "asked": "fp32"},
    )  # asked for: nothing measured or kept

"""Whether a translation's decoder steps are compiled on a CPU
(`mtkit.tuning.compile.compile_choice`): what rules them out, the measured choice with
faked timings, kept in measured.json, and a failed compilation; one real compiled search
of a tiny model where a C++ compiler is present."""

from __future__ import annotations

import logging

import pytest
import torch
from scripted import random_model, random_src

import mtkit
from mtkit.core.config import DecodeConfig
from mtkit.core.errors import OptionError
from mtkit.engines.loader import load_engine
from mtkit.search.beam import greedy_search
from mtkit.search.captured import CapturedDecoder, compiled_step_timer
from mtkit.tuning import compile as compiling
from mtkit.tuning.compile import compile_choice, compiler_missing, inductor_capture

from conftest import cli, one_line_error

CPU = torch.device("cpu")
KEY = {"model": [1, 16, 2, 32, 120, 120], "precision": "fp32", "attention": "sdpa"}


def never():
    raise AssertionError("measured")


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """measured.json in a folder of the test's, and a C++ compiler, as far as the choice
    knows (the measurements are faked)."""
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiling, "compiler_missing", lambda: None)
    return tmp_path / "cache" / "measured.json"


def test_compiled_steps_need_a_cpu_one_process_and_a_compiler(monkeypatch, caplog):
    assert compile_choice("off", CPU, KEY, never) == {"compile": "off", "asked": "off"}
    assert "on a CPU" in compile_choice("on", torch.device("cuda"), KEY, never)["why"]
    assert "--workers 2" in compile_choice("auto", CPU, KEY, never, workers=2)["why"]
    assert compile_choice("on", CPU, KEY, never) in (
        {"compile": "on", "asked": "on"},
        {"compile": "off", "asked": "on", "why": compiler_missing()},
    )
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="mtkit.tuning.compile"):
        record = compile_choice("on", CPU, KEY, never)
    assert record == {
        "compile": "off",
        "asked": "on",
        "why": "no C++ compiler (g++, c++, clang++) on the PATH, which Inductor needs",
    }
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"--compile on: decoder steps run eagerly: {record['why']}")
    ]


def test_compile_must_be_auto_on_or_off(tmp_path):
    with pytest.raises(OptionError, match="--compile must be auto, on or off, got 'yes'"):
        load_engine("never-read.pt", compile="yes")
    with pytest.raises(mtkit.Error, match="compile must be auto, on or off, got 'yes'"):
        mtkit.Translator.load(tmp_path / "never-read.pt", compile="yes")
    result = cli("translate", "-m", tmp_path / "never-read.pt", "--compile", "yes")
    one_line_error(result, "--compile must be auto, on or off, got 'yes'")
    assert DecodeConfig().compile == "off"  # slower than eager on the developers' CPU


def test_auto_compiles_where_a_step_is_clearly_faster_and_keeps_the_choice(kept, caplog):
    with caplog.at_level(logging.DEBUG, logger="mtkit.tuning.compile"):
        record = compile_choice("auto", CPU, KEY, lambda: (0.010, 0.004, 12.5))
    assert record == {
        "compile": "on",
        "asked": "auto",
        "eager_ms": 10.0,
        "compiled_ms": 4.0,
        "compile_s": 12.5,
    }
    assert "10.00 ms eagerly and 4.00 ms compiled (compiling took 12.5 s): compiled" in caplog.text
    assert compile_choice("auto", CPU, KEY, never) == record  # kept: never measured again
    other = {**KEY, "precision": "bf16"}  # another key is measured for itself
    slower = compile_choice("auto", CPU, other, lambda: (0.010, 0.0095, 3.0))
    assert slower["compile"] == "off" and slower["compiled_ms"] == 9.5
    assert kept.is_file()


def test_a_failed_compilation_means_eager_steps_with_one_log_line(kept, caplog):
    def failing():
        raise RuntimeError("C++ compile error\ncc1plus: fatal error: Python.h: no such file")

    with caplog.at_level(logging.DEBUG, logger="mtkit.tuning.compile"):
        record = compile_choice("auto", CPU, KEY, failing)
    assert record == {"compile": "off", "asked": "auto", "why": "C++ compile error"}
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            "--compile auto: compiling a decoder step failed (C++ compile error); eager steps",
        )
    ]
    assert compile_choice("auto", CPU, KEY, never) == record  # kept like a measured one


@pytest.mark.skipif(compiler_missing() is not None, reason="Inductor needs a C++ compiler")
def test_compiled_steps_give_eager_outputs_and_shapes_past_the_bound_run_eagerly(
    monkeypatch, caplog
):
    model, src = random_model(3), random_src(2, 2)  # two shapes: 2 rows, then 1
    monkeypatch.setattr(compiling, "COMPILED_SHAPES", 1)
    torch._dynamo.reset()
    stepper = CapturedDecoder(model, inductor_capture)
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        eager = greedy_search(model, src)
        compiled = greedy_search(stepper, src)
    assert compiled == eager
    assert stepper.record()["shapes"] == 1 and stepper.record()["failed"] == 1
    assert stepper.record()["replayed_steps"] > 0 and stepper.record()["eager_steps"] > 1
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().endswith(
        "run eagerly: 1 step shapes are compiled in this process, the most"
    )
    assert torch._dynamo.config.recompile_limit == 8  # its default: nothing else changed


def test_auto_times_a_full_batch_and_a_failed_capture_is_one_log_line(kept, caplog):
    shapes = []

    def counted(step):  # a capture that records nothing (`test_captured.stand_in`)
        shapes.append(1)
        return step

    model = random_model(3)
    eager, captured, _ = compiled_step_timer(model, counted, 40, batch_tokens=64, beam=2)()
    assert eager > 0 and captured > 0 and shapes  # the captured search met its shapes

    def broken(step):
        raise RuntimeError("InductorError: C++ compile error")

    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        record = compile_choice("auto", CPU, KEY, compiled_step_timer(model, broken, 40, 64, 2))
    assert record == {"compile": "off", "asked": "auto", "why": "InductorError: C++ compile error"}
    assert [r.levelname for r in caplog.records] == ["WARNING"]

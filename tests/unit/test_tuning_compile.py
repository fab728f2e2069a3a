"""Compiled decoder steps on a CPU (`mtkit.search.compiled`) and whether a translation
takes them (`mtkit.tuning.compile.compile_choice`): what rules them out, the measured
choice with faked timings, kept in measured.json, a failed compilation, a worker
helper's fork that meets a step its engine did not compile; one real compiled search of
a tiny model where a C++ compiler is present."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scripted import random_model, random_src

import mtkit
from mtkit.core.config import DecodeConfig
from mtkit.core.errors import OptionError
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine
from mtkit.search.beam import beam_search, greedy_search
from mtkit.search.compiled import ISA_FOLDER, CompiledDecoder, cache_per_isa, compiled_step_timer
from mtkit.tuning import compile as compiling
from mtkit.tuning.compile import compile_choice, compiler_missing

from conftest import cli, one_line_error

CPU = torch.device("cpu")
TESTS = str(Path(__file__).resolve().parents[1])
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


def test_compiled_steps_need_a_cpu_and_a_compiler(monkeypatch, caplog):
    assert compile_choice("off", CPU, KEY, never) == {"compile": "off", "asked": "off"}
    assert "on a CPU" in compile_choice("on", torch.device("cuda"), KEY, never)["why"]
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
    assert DecodeConfig().compile == "off"  # a first compile takes a minute (docs)


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


def stand_in(step):
    """A compiler that compiles nothing: the compiled decoder's own function, run as is."""
    return step


def refusing(step):
    def run(*args):
        raise RuntimeError("InductorError: C++ compile error\nmore")

    return run


@pytest.mark.parametrize("beam", [1, 3])
def test_a_compiled_decoder_steps_its_growing_cache_as_the_model_does(beam):
    model, src = random_model(3), random_src(4)  # sentences leave the batch on the way
    stepper = CompiledDecoder(model, stand_in)
    options = SearchOptions(beam=beam)
    search = greedy_search if beam == 1 else beam_search
    with torch.inference_mode():
        assert search(stepper, src, options) == search(model, src, options)
    record = stepper.record()
    # the first two steps (no cache, one position), and the last sentence alone, eagerly
    assert record["compiled_steps"] > 2 and record["eager_steps"] >= 2
    assert "failed" not in record


def test_a_step_that_fails_to_compile_runs_eagerly_with_one_log_line(caplog):
    model, src = random_model(3), random_src(4)
    stepper = CompiledDecoder(model, refusing)
    with torch.inference_mode(), caplog.at_level(logging.DEBUG, logger="mtkit.search.compiled"):
        assert greedy_search(stepper, src) == greedy_search(model, src)
    assert stepper.record() == {
        "compiled_steps": 0,
        "eager_steps": stepper.eager_steps,
        "failed": "InductorError: C++ compile error",
    }
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "decoder steps run eagerly: InductorError: C++ compile error")
    ]


def test_a_forked_helper_steps_eagerly_where_its_engine_compiled_nothing(caplog):
    """A fork compiles nothing (it refuses a new graph, `fail_on_recompile`): such a
    kind of step runs eagerly there, told at debug level, the others stay compiled."""
    model, src = random_model(3), random_src(4)
    calls = []

    def greedy_refused(step):
        def run(model, token, start, src_mask, *rest):
            calls.append(token.size(0) == src_mask.size(0))
            if token.size(0) == src_mask.size(0):  # greedy: one row per sentence
                raise RuntimeError("Detected recompile when torch.compile stance is ...")
            return step(model, token, start, src_mask, *rest)

        return run

    stepper = CompiledDecoder(model, greedy_refused)
    stepper.pid = -1  # made in another process: this one is its fork
    with torch.inference_mode(), caplog.at_level(logging.DEBUG, logger="mtkit.search.compiled"):
        assert greedy_search(stepper, src) == greedy_search(model, src)
        assert calls == [True]  # tried once, then that kind steps eagerly
        beams = beam_search(stepper, src, SearchOptions(beam=3))
        assert beams == beam_search(model, src, SearchOptions(beam=3))
    assert stepper.refused == {(True, True)} and stepper.compiled_steps > 0
    assert "failed" not in stepper.record()
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


@pytest.mark.skipif(compiler_missing() is not None, reason="Inductor needs a C++ compiler")
def test_inductor_compiles_one_graph_for_every_size_a_search_meets():
    model, src = random_model(3), random_src(6)  # six lengths, rows leaving
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # (of the process)
    stepper = CompiledDecoder(model)
    options = SearchOptions(beam=2)
    with torch.inference_mode():
        eager = beam_search(model, src, options)
        compiled = beam_search(stepper, src, options)
        again = beam_search(stepper, src[:3], options)  # other sizes: the same graph
    assert [h[0].tokens for h in compiled] == [h[0].tokens for h in eager]
    assert [h[0].tokens for h in again] == [h[0].tokens for h in eager[:3]]
    for mine, theirs in zip(compiled, eager, strict=True):
        assert mine[0].score == pytest.approx(theirs[0].score, abs=1e-4)
    assert stepper.compiled_steps > 4 and "failed" not in stepper.record()
    compiled_now = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    assert compiled_now == 1  # one graph: rows, sentences, widths and positions are symbols


ONE_SEARCH = """
import json, sys, torch
from scripted import random_model, random_src
from mtkit.core.search_options import SearchOptions
from mtkit.search import compiled
from mtkit.search.beam import beam_search
model, src = random_model(3), random_src(6)
stepper = compiled.CompiledDecoder(model)
with torch.inference_mode():
    mine, theirs = (beam_search(m, src, SearchOptions(beam=2)) for m in (stepper, model))
    same = [h[0].tokens for h in mine] == [h[0].tokens for h in theirs]
print(json.dumps({"same": same, **stepper.record()}))
"""

NARROWER = {"AVX512": "avx2", "AVX2": "default"}  # a capability below the CPU's own


def search_under(capability: str | None, cache: Path) -> dict:
    """One compiled beam search of a tiny model in a process of its own, with
    `ATEN_CPU_CAPABILITY` and Inductor's disk cache `cache`: its record and whether its
    hypotheses are the eager search's."""
    path = os.pathsep.join([TESTS, str(Path(TESTS).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": path}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run(
        [sys.executable, "-c", ONE_SEARCH], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(compiler_missing() is not None, reason="Inductor needs a C++ compiler")
@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in NARROWER, reason="one vector ISA only"
)
def test_kernels_cached_for_one_vector_isa_are_not_read_back_under_another(tmp_path):
    """PyTorch's cache key lacks the vector ISA: a graph compiled for the CPU's own
    vectors and read back under narrower ones (`ATEN_CPU_CAPABILITY`) steps wrongly.
    Each ISA gets its own folder of the cache the user chose."""
    narrower = NARROWER[torch.backends.cpu.get_cpu_capability()]
    first = search_under(None, tmp_path)
    second = search_under(narrower, tmp_path)
    for record in (first, second):
        assert record["same"] and record["compiled_steps"] > 4 and "failed" not in record
    folders = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(ISA_FOLDER))
    assert len(folders) == 2  # the CPU's own, and the narrower one


def test_the_cache_folder_of_an_isa_is_inside_the_one_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("torch._inductor.cpu_vec_isa.pick_vec_isa", lambda: "avx2")
    assert cache_per_isa() == str(tmp_path / f"{ISA_FOLDER}avx2")
    assert cache_per_isa() == str(tmp_path / f"{ISA_FOLDER}avx2")  # idempotent
    monkeypatch.setattr("torch._inductor.cpu_vec_isa.pick_vec_isa", lambda: "avx512 vnni")
    assert cache_per_isa() == str(tmp_path / f"{ISA_FOLDER}avx512_vnni")  # a child's own
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / f"{ISA_FOLDER}avx512_vnni")


def test_auto_times_a_full_batch_and_a_failed_compile_is_one_log_line(kept, caplog):
    model = random_model(3)
    eager, compiled, _ = compiled_step_timer(
        model, 40, batch_tokens=64, beam=2, compiler=stand_in
    )()
    assert eager > 0 and compiled > 0
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        record = compile_choice(
            "auto", CPU, KEY, compiled_step_timer(model, 40, 64, 2, compiler=refusing)
        )
    assert record == {"compile": "off", "asked": "auto", "why": "InductorError: C++ compile error"}
    assert [r.levelname for r in caplog.records] == ["WARNING"]

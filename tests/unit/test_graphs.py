"""Captured updates (`mtkit.training.graphs`) on a CPU: an eager stand-in for CUDA's graph
capture (warm-up updates, then the update itself as the "replay") runs the static
buffers, the device-side bookkeeping, the RNG hand-back around capturing and the eager
fallback as a GPU would, and `auto`'s measurement. The decision, with faked timings, is
tested in test_tuning_capture.py; the real capture runs in tests/unit/test_cuda.py and
`benchmarks/gpu_check.sh`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from mtkit.core.checkpoint import load_checkpoint
from mtkit.core.config import config_from_dict
from mtkit.training.loop import train
from mtkit.tuning import capture
from mtkit.tuning.capture import WARMUP_RUNS

from conftest import tiny_config_dict


def stand_in(captures: list, failing: int | None = None):
    """A capture for the CPU: the warm-up updates, then the update itself as its replay.
    The `failing`-th capture (from 1) raises, as CUDA does for what it cannot capture."""

    def capture(update):
        captures.append(update)
        if len(captures) == failing:
            raise RuntimeError("operation not permitted when stream is capturing")
        for _ in range(WARMUP_RUNS):
            update()
        return update

    return capture


def run_with(prepared, folder: Path, corpus, steps: int, graphs_on: bool, shapes="classes"):
    if not (folder / "run").exists():
        shutil.copytree(prepared, folder / "run")
    data = tiny_config_dict(
        corpus,
        folder / "run",
        model={"dropout": 0.1},
        train={
            "max_steps": steps,
            "valid_every": 4,
            "log_every": 4,
            "cuda_graphs": "on" if graphs_on else "off",
            "batch_shapes": shapes,  # classes: few shapes, each captured once
        },
    )
    return config_from_dict(data)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").open()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_captured_updates_train_as_eager_ones_and_capturing_draws_no_random_number(
    prepared, tmp_path, corpus, monkeypatch
):
    captures: list = []
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in(captures))
    eager = run_with(prepared, tmp_path / "eager", corpus, 8, graphs_on=False)
    train(eager)
    captured = run_with(prepared, tmp_path / "graphs", corpus, 8, graphs_on=True)
    train(captured)

    log = events(captured.run_path)
    assert log[0]["graphs"] == {"graphs": "on", "asked": "on"}
    assert [e["captured_updates"] for e in log if e["event"] == "train"] == ["4/4", "4/4"]
    assert 1 <= len(captures) < 8  # one capture per shape, replayed for its other batches
    # The same updates (dropout 0.1: the same masks, so the warm-ups' draws were handed
    # back), up to the order of the loss's sums (the dense loss masks pad rows) and the
    # key biases, whose gradient is 0 up to rounding (see test_multinode).
    a, b = weights(eager.run_path), weights(captured.run_path)
    for name in a:
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    valid = [
        [e["valid_loss"] for e in events(c.run_path) if e["event"] == "valid"]
        for c in (eager, captured)
    ]
    assert valid[0] == pytest.approx(valid[1], rel=1e-4)


def test_a_run_under_graphs_resumes_to_the_weights_of_one_that_never_stopped(
    prepared, tmp_path, corpus, monkeypatch
):
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in([]))
    whole = run_with(prepared, tmp_path / "whole", corpus, 12, graphs_on=True)
    train(whole)
    part = run_with(prepared, tmp_path / "part", corpus, 4, graphs_on=True)
    train(part)  # stops at step 4; the resumed run captures its shapes again
    assert train(dataclasses.replace(part, train=whole.train)).step == 12
    a, b = weights(whole.run_path), weights(part.run_path)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_shape_that_cannot_be_captured_runs_eagerly_and_is_recorded(
    prepared, tmp_path, corpus, monkeypatch
):
    captures: list = []
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in(captures, failing=1))
    cfg = run_with(prepared, tmp_path, corpus, 8, graphs_on=True)
    assert train(cfg).step == 8
    log = events(cfg.run_path)
    fallbacks = [e for e in log if e["event"] == "graph_fallback"]
    assert len(fallbacks) == 1 and "stream is capturing" in fallbacks[0]["why"]
    counts = [e["captured_updates"] for e in log if e["event"] == "train"]
    captured = sum(int(c.split("/")[0]) for c in counts)
    assert len(captures) > 1 and 0 < captured < 8  # the other shapes still replay
    assert all(torch.isfinite(w).all() for w in weights(cfg.run_path).values())


def test_batch_shapes_auto_takes_few_shapes_where_graphs_may_run(
    prepared, tmp_path, corpus, monkeypatch
):
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in([]))
    cfg = run_with(prepared, tmp_path, corpus, 4, graphs_on=True, shapes="auto")
    train(cfg)
    batches = events(cfg.run_path)[0]["batches"]
    assert batches["shapes"] == "classes" and batches["why"] == "CUDA graphs want few shapes"


def test_auto_times_both_kinds_of_update_on_a_copy_and_leaves_the_run_as_it_was(
    prepared, tmp_path, corpus, monkeypatch
):
    """The real timer (`update_timer`: a copy of the model, eager updates and replays),
    with the CPU's stand-in capture: the decision and both figures are recorded, and the
    run's weights are those of a run told that decision without measuring."""
    monkeypatch.setitem(capture.CAPTURES, "cpu", stand_in([]))
    auto = run_with(prepared, tmp_path / "auto", corpus, 4, graphs_on=True)
    auto = dataclasses.replace(auto, train=dataclasses.replace(auto.train, cuda_graphs="auto"))
    train(auto)
    record = events(auto.run_path)[0]["graphs"]
    assert record["asked"] == "auto" and record["eager_ms"] > 0 and record["graph_ms"] > 0
    told = run_with(prepared, tmp_path / "told", corpus, 4, graphs_on=record["graphs"] == "on")
    train(told)
    a, b = weights(auto.run_path), weights(told.run_path)
    assert all(torch.equal(a[k], b[k]) for k in a)

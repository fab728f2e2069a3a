"""Whether training updates run as CUDA graphs (`mtkit.tuning.capture.choose_graphs`):
what rules them out, and the measured choice, with faked timings (the measurement itself
is tested in test_graphs.py, with the CPU's stand-in capture)."""

from __future__ import annotations

import dataclasses

import torch

from mtkit.core.config import TrainConfig
from mtkit.tuning.capture import choose_graphs


def test_graphs_need_cuda_one_process_and_one_batch_per_update():
    cuda, cpu, tc = torch.device("cuda"), torch.device("cpu"), TrainConfig()

    def never():
        raise AssertionError("measured")

    assert choose_graphs("off", cuda, tc, False, never) == {"graphs": "off", "asked": "off"}
    assert choose_graphs("on", cpu, tc, False, never)["why"] == "not on CUDA"
    assert choose_graphs("auto", cuda, tc, True, never) == {
        "graphs": "off",
        "asked": "auto",
        "why": "under DDP",
    }
    accumulating = dataclasses.replace(tc, update_freq=2)
    assert choose_graphs("auto", cuda, accumulating, False, never)["why"] == (
        "train.update_freq > 1"
    )
    assert choose_graphs("on", cuda, tc, False, never) == {"graphs": "on", "asked": "on"}


def test_auto_takes_graphs_where_a_replayed_update_is_clearly_faster(caplog):
    cuda, tc = torch.device("cuda"), TrainConfig()
    with caplog.at_level("INFO", logger="mtkit.tuning.capture"):
        record = choose_graphs("auto", cuda, tc, False, lambda: (0.028, 0.0045))
    assert record == {"graphs": "on", "asked": "auto", "eager_ms": 28.0, "graph_ms": 4.5}
    assert "28.00 ms eagerly and 4.50 ms replayed: graphs" in caplog.text
    assert choose_graphs("auto", cuda, tc, False, lambda: (0.005, 0.0048))["graphs"] == "off"
    failed = choose_graphs("auto", cuda, tc, False, lambda: (0.005, float("inf")))
    assert failed["graphs"] == "off"

    def broken():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    record = choose_graphs("auto", cuda, tc, False, broken)
    assert record["graphs"] == "off" and "stream is capturing" in record["why"]


def test_graphs_are_off_unless_asked_for():
    assert TrainConfig().cuda_graphs == "off"  # until measured on a GPU

"""A training run's measured choices (`mtkit.tuning.run`): `decided_once`, one mechanism
for every measured run choice, and the record checkpoints store them in."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtkit.core.errors import TrainError
from mtkit.tuning import run
from mtkit.tuning.run import (
    ATTENTION,
    PRECISION,
    Decision,
    RunChoices,
    decided_once,
    stored_choices,
)


def _counting(decision):
    """A fake measurement: returns `decision`, counting its calls."""
    calls = []

    def measure():
        calls.append(1)
        return decision

    return measure, calls


def test_decided_once_measures_a_fresh_run_and_stores_the_record():
    measure, calls = _counting(Decision("matmul", "auto", {"sdpa_ms": 13.8, "matmul_ms": 1.7}))
    decision = decided_once(ATTENTION, "auto", None, measure)
    assert calls == [1] and decision.value == "matmul"
    assert ATTENTION.record(decision) == {
        "kernel": "matmul",
        "asked": "auto",
        "sdpa_ms": 13.8,
        "matmul_ms": 1.7,
    }
    assert ATTENTION.decision(ATTENTION.record(decision)) == decision


@pytest.mark.parametrize("asked", ["auto", "bf16"])
def test_decided_once_reuses_a_stored_choice_without_measuring(tmp_path, asked):
    stored = {"precision": "bf16", "asked": "auto", "calibration": {"fp32_ms": 9.0, "bf16_ms": 3.0}}
    measure, calls = _counting(None)
    decision = decided_once(PRECISION, asked, (tmp_path / "last.pt", stored), measure)
    assert calls == [] and PRECISION.record(decision) == stored


@pytest.mark.parametrize(
    "choice_name, stored, asked, says",
    [
        (
            "PRECISION",
            {"precision": "bf16", "asked": "auto"},
            "fp32",
            "last.pt was trained in bf16, the config says train.precision=fp32; resume with "
            "train.precision=bf16 (or auto), or start over with --no-resume",
        ),
        (
            "ATTENTION",
            {"kernel": "matmul", "asked": "auto"},
            "sdpa",
            "last.pt was trained with train.attention=matmul, the config says sdpa; resume with "
            "train.attention=matmul (or auto), or start over with --no-resume",
        ),
        (
            "BATCH_SHAPES",
            {"shapes": "exact", "asked": "auto"},
            "classes",
            "last.pt was trained with train.batch_shapes=exact, the config says classes; resume "
            "with train.batch_shapes=exact (or auto), or start over with --no-resume",
        ),
    ],
)
def test_decided_once_refuses_a_resume_that_asks_for_another_value(
    tmp_path, choice_name, stored, asked, says
):
    measure, calls = _counting(None)
    with pytest.raises(TrainError) as refused:
        decided_once(getattr(run, choice_name), asked, (tmp_path / "last.pt", stored), measure)
    assert str(refused.value).endswith(says) and calls == []


def test_the_run_choices_are_stored_in_the_format_checkpoints_have_always_had():
    """The precision's record holds the attention's and the batch shapes' (checkpoints and
    metrics.jsonl's `start` record, as before `decided_once`), and reads back the same."""
    choices = RunChoices(
        Decision(
            "bf16", "auto", {"calibration": {"fp32_ms": 9.0, "bf16_ms": 3.0}, "cpu": "AMD EPYC"}
        ),
        Decision("matmul", "auto", {"sdpa_ms": 13.8, "matmul_ms": 1.7}),
        Decision("classes", "auto", {"multiple": 8, "group": 4}),
        Decision("on", "auto", {"eager_ms": 28.0, "graph_ms": 4.0}),
    )
    record = choices.as_record()
    assert record == {
        "precision": "bf16",
        "asked": "auto",
        "calibration": {"fp32_ms": 9.0, "bf16_ms": 3.0},
        "cpu": "AMD EPYC",
        "attention": {"kernel": "matmul", "asked": "auto", "sdpa_ms": 13.8, "matmul_ms": 1.7},
        "batches": {"shapes": "classes", "asked": "auto", "multiple": 8, "group": 4},
        "graphs": {"graphs": "on", "asked": "auto", "eager_ms": 28.0, "graph_ms": 4.0},
    }
    stored = stored_choices((Path("last.pt"), {"train": {"precision": record}}))
    assert stored["attention"][1] == record["attention"]
    assert stored["graphs"][1] == record["graphs"]
    assert "attention" not in stored["precision"][1] and "graphs" not in stored["precision"][1]

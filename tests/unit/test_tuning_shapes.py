"""How a run chooses to batch in few shapes (`mtkit.tuning.shapes`), with faked timings,
and the real shape timer."""

from __future__ import annotations

import torch

from mtkit.tuning.attention import AttentionShape
from mtkit.tuning.shapes import choose_batch_shapes

SHAPE = AttentionShape.of_run(max_tokens=4096, mean_length=15.6, d_model=256, heads=4)


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

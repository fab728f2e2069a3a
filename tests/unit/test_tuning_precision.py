"""`precision: auto`'s measurement (`mtkit.tuning.precision`), with faked timings: the
decision logic, apart from the speed of the machine the tests run on."""

from __future__ import annotations

import random

import torch

from mtkit.tuning.precision import BF16_MARGIN, calibrate_cpu

ROWS = 1024


class FakeTimer:
    """A `Measure` with a set speed per precision: the first call of each (dtype, rows)
    pays `first_call` times its cost (kernel selection, JIT), and with `load` a seeded
    random share of calls is slowed by another process, by up to `load` times."""

    def __init__(
        self,
        fp32_s: float,
        bf16_s: float,
        first_call: float = 1.0,
        load: float = 0.0,
        seed: int = 0,
    ):
        self.cost = {None: fp32_s, torch.bfloat16: bf16_s}
        self.first_call, self.load = first_call, load
        self.rng = random.Random(seed)
        self.calls: list[tuple[torch.dtype | None, int]] = []

    def __call__(self, dtype: torch.dtype | None, rows: int) -> float:
        seconds = self.cost[dtype] * rows / ROWS
        if (dtype, rows) not in self.calls:
            seconds *= self.first_call
        self.calls.append((dtype, rows))
        if self.load and self.rng.random() < 0.4:  # another process has the cores
            seconds *= 1 + self.rng.random() * self.load
        return seconds


def choose(timer: FakeTimer) -> bool:
    return calibrate_cpu(ROWS, 256, 1024, measure=timer).bf16_faster


def test_the_first_bf16_call_is_a_warm_up_not_a_timing():
    # One run in three once chose fp32 here: its bf16 probe was the first bf16 call,
    # 70x slower than the rest (kernel selection), and it was taken for bf16's speed.
    timer = FakeTimer(fp32_s=7e-3, bf16_s=2e-3, first_call=70.0)
    calibration = calibrate_cpu(ROWS, 256, 1024, measure=timer)
    assert calibration.bf16_faster
    assert calibration.bf16_s == 2e-3 and calibration.fp32_s == 7e-3
    first = {key: timer.calls.index(key) for key in set(timer.calls)}
    assert len(first) == 3  # fp32, the bf16 probe and full bf16, each warmed up first


def test_a_loaded_machine_makes_the_idle_machines_choice_in_20_of_20_starts():
    for fp32_s, bf16_s in ((4.67e-3, 1.35e-3), (7e-3, 5.6e-3), (5e-3, 5.5e-3), (2e-3, 3e-3)):
        idle = choose(FakeTimer(fp32_s, bf16_s))
        assert idle == (bf16_s <= BF16_MARGIN * fp32_s)
        loaded = [
            choose(FakeTimer(fp32_s, bf16_s, first_call=30.0, load=20.0, seed=seed))
            for seed in range(20)
        ]
        assert loaded == [idle] * 20, (fp32_s, bf16_s, loaded)


def test_hopeless_bf16_ends_the_calibration_at_its_probe():
    # Without bf16 instructions bf16 ran 40x slower: never timed at full size.
    timer = FakeTimer(fp32_s=5e-3, bf16_s=0.2)
    calibration = calibrate_cpu(ROWS, 256, 1024, measure=timer)
    assert not calibration.bf16_faster
    assert (torch.bfloat16, ROWS) not in timer.calls
    assert calibration.bf16_s == 0.2 and len(timer.calls) <= 10


def test_the_real_timer_runs_and_reports_its_figures():
    calibration = calibrate_cpu(64, 32, 64)
    figures = calibration.as_dict()
    assert set(figures) == {"fp32_ms", "bf16_ms"}
    assert figures["fp32_ms"] > 0 and figures["bf16_ms"] > 0


def test_translations_timer_runs_bf16_weights_without_autocast(monkeypatch):
    """Translation's `auto` times what it will run: a Linear whose weights and inputs are
    bf16 (`engines.pytorch_precision.bf16_weights`), forward only; training's, under autocast."""
    from mtkit.tuning import precision

    seen = []
    real = torch.nn.functional.linear

    def linear(x, weight, bias=None):
        seen.append((x.dtype, weight.dtype, torch.is_autocast_enabled("cpu")))
        return real(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    once = precision.linear_timer(8, 4, 4, backward=False)
    assert once(torch.bfloat16, 8) > 0 and once(None, 8) > 0
    assert seen == [(torch.bfloat16, torch.bfloat16, False), (torch.float32, torch.float32, False)]
    seen.clear()
    precision.linear_timer(8, 4, 4)(torch.bfloat16, 8)  # training: autocast, fp32 weights
    assert seen == [(torch.float32, torch.float32, True)]

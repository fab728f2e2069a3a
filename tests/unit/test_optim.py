"""The optimizer's schedule (`mtkit.optim`)."""

from __future__ import annotations

import pytest

from mtkit.optim import inverse_sqrt_lr


def test_schedule_warms_up_then_decays_as_inverse_sqrt():
    assert inverse_sqrt_lr(1, 1e-3, 100) == pytest.approx(1e-5)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(7, 1e-3, 0) == 1e-3

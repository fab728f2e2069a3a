"""The optimizer's schedule (`mtkit.training.optim`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtkit.core.config import TrainConfig, config_from_dict
from mtkit.core.configcheck import ConfigError
from mtkit.training.optim import (
    adamw,
    budget_used,
    inverse_sqrt_lr,
    learning_rate,
    per_token_gradients,
)


def test_schedule_warms_up_then_decays_as_inverse_sqrt():
    assert inverse_sqrt_lr(1, 1e-3, 100) == pytest.approx(1e-5)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(7, 1e-3, 0) == 1e-3


def test_linear_schedule_warms_up_then_decays_to_zero_at_the_step_budget():
    tc = TrainConfig(lr=1e-3, warmup_steps=100, max_steps=1000, lr_schedule="linear")
    assert learning_rate(1, 0.0, tc) == pytest.approx(1e-5 * (1 - 0 / 1000))
    assert learning_rate(100, 0.0, tc) == pytest.approx(1e-3 * (1 - 99 / 1000))
    assert learning_rate(550, 0.0, tc) == pytest.approx(1e-3 * 0.451)
    assert learning_rate(1000, 0.0, tc) == pytest.approx(1e-6)  # the last update: small, not 0
    assert learning_rate(1001, 0.0, tc) == 0.0
    rates = [learning_rate(s, 0.0, tc) for s in range(100, 1001)]
    assert all(a > b for a, b in zip(rates, rates[1:]))


def test_linear_schedule_follows_the_training_clock_under_max_time():
    tc = TrainConfig(lr=1e-3, warmup_steps=0, max_time=600, lr_schedule="linear")
    assert learning_rate(50, 150.0, tc) == pytest.approx(7.5e-4)
    assert learning_rate(50, 600.0, tc) == 0.0
    both = TrainConfig(
        lr=1e-3, warmup_steps=0, max_time=600, max_steps=100, lr_schedule="linear"
    )  # whichever budget runs out first
    assert learning_rate(51, 150.0, both) == pytest.approx(5e-4)
    assert learning_rate(11, 450.0, both) == pytest.approx(2.5e-4)
    assert budget_used(10, 0.0, TrainConfig()) == 0.0


def test_inverse_sqrt_stays_the_default_schedule():
    tc = TrainConfig(lr=1e-3, warmup_steps=100, max_steps=1000)
    assert learning_rate(400, 123.0, tc) == inverse_sqrt_lr(400, 1e-3, 100)


def test_linear_schedule_without_a_budget_is_one_line_naming_the_keys():
    with pytest.raises(
        ConfigError,
        match=r"train.lr_schedule: linear .* train.max_steps or "
        r"train.max_time",
    ):
        config_from_dict({"train": {"lr_schedule": "linear"}})
    assert config_from_dict({"train": {"lr_schedule": "linear", "max_time": 60}})


def _summed_gradients(scale: float) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    (model(torch.randn(32, 8)).pow(2).sum() * scale).backward()
    return model


@pytest.mark.parametrize(("clip", "scale"), [(1.0, 1.0), (1.0, 1e-3), (0.0, 1.0)])
def test_per_token_gradients_divide_then_clip_as_two_passes_would(clip, scale):
    tokens = 37
    model, reference = _summed_gradients(scale), _summed_gradients(scale)
    for p in reference.parameters():
        p.grad.div_(tokens)
    want = nn.utils.clip_grad_norm_(reference.parameters(), clip if clip > 0 else float("inf"))
    norm = per_token_gradients(model, tokens, clip, torch.device("cpu"), distributed=False)
    torch.testing.assert_close(norm, want)
    clipped = clip > 0 and float(want) > clip
    assert clipped == (scale == 1.0 and clip > 0)  # both kinds of update are covered
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_per_token_gradients_pass_a_non_finite_norm_on():
    model = _summed_gradients(1.0)
    next(model.parameters()).grad[0, 0] = float("nan")
    norm = per_token_gradients(model, 10, 1.0, torch.device("cpu"), distributed=False)
    assert not torch.isfinite(norm)


def test_adamw_is_fused_on_cpu():
    model = _summed_gradients(1.0)
    optimizer = adamw(model, TrainConfig(), torch.device("cpu"))
    assert optimizer.defaults["fused"] is True
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_adamw_falls_back_to_unfused_where_this_torch_has_no_fused_kernel(monkeypatch):
    real = torch.optim.AdamW

    def no_fused(params, fused=None, **kw):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be ... cuda")
        return real(params, fused=fused, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    optimizer = adamw(_summed_gradients(1.0), TrainConfig(), torch.device("cpu"))
    assert optimizer.defaults["fused"] is False

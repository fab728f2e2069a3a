"""The optimizer and its schedule: AdamW with the paper's betas, the learning-rate schedules
(the paper's inverse-square-root warm-up, or a linear decay over the run's budget), and the
per-token scaling and clipping of one update's gradients."""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist
from torch import nn

from mtkit.core.config import TrainConfig

log = logging.getLogger(__name__)


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` at `warmup` steps, then peak * sqrt(warmup / step): the
    paper's schedule d^-0.5 * min(step^-0.5, step * warmup^-1.5) with its peak named."""
    step = max(step, 1)
    if warmup == 0:
        return peak
    return peak * min(step / warmup, math.sqrt(warmup / step))


def linear_decay_lr(step: int, peak: float, warmup: int, used: float) -> float:
    """Linear warm-up, then a linear decay to 0 at the end of the budget: `used` is the
    share of it that the updates before this one took (`budget_used`). Short, budgeted
    runs end with small steps instead of the inverse square root's still large ones (Li
    et al. 2020, "Budgeted training"). Far from convergence it costs BLEU, where every bit
    of rate still helps (docs/configuration.md, "How the presets were chosen")."""
    warm = 1.0 if warmup == 0 else min(1.0, max(step, 1) / warmup)
    return peak * warm * max(0.0, 1.0 - used)


def budget_used(step: int, elapsed: float, tc: TrainConfig) -> float:
    """The share of the training budget that `step` updates and `elapsed` seconds of
    training have used: the larger of `max_steps`' and `max_time`'s (0 when neither is
    set; the config check asks for one under the linear schedule)."""
    shares = [step / tc.max_steps] if tc.max_steps else []
    if tc.max_time:
        shares.append(elapsed / tc.max_time)
    return min(1.0, max(shares, default=0.0))


def learning_rate(step: int, elapsed: float, tc: TrainConfig) -> float:
    """The learning rate of update `step` (from 1) under `train.lr_schedule`, when the
    updates before it took `elapsed` seconds of training (`Progress.elapsed`). Under
    `max_time` the linear schedule follows that clock, so its rates depend on the
    machine's speed and differ between two runs; under `max_steps` alone it is a function
    of the step, and resume stays exact."""
    if tc.lr_schedule == "linear":
        return linear_decay_lr(step, tc.lr, tc.warmup_steps, budget_used(step - 1, elapsed, tc))
    return inverse_sqrt_lr(step, tc.lr, tc.warmup_steps)


def adamw(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with the paper's betas (0.9, 0.98) and eps 1e-9, at the schedule's first
    learning rate; fused, one call for all parameters, on CUDA and on a CPU (instead of
    PyTorch's loop of eight operations per tensor), unless this torch has no fused kernel
    for the device. A resumed run keeps the kind it was saved with (`load_state_dict`
    restores it), so that it continues exactly. `device` is where the parameters are."""
    settings = dict(
        lr=learning_rate(1, 0.0, tc), betas=(0.9, 0.98), eps=1e-9, weight_decay=tc.weight_decay
    )
    try:
        return torch.optim.AdamW(model.parameters(), **settings, fused=True)
    except RuntimeError:  # a torch without a fused AdamW for this device
        log.info("AdamW: no fused kernel for %s in this torch; unfused", device.type)
        return torch.optim.AdamW(model.parameters(), **settings, fused=False)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def per_token_gradients(
    model: nn.Module, tokens: int, clip_norm: float, device: torch.device, distributed: bool
) -> torch.Tensor:
    """Turn the summed gradients of one update into per-token means, clip them, and
    return their norm before clipping (non-finite when the loss was).

    Each rank's gradients hold sums over its own tokens, averaged over ranks by DDP, so
    they are divided by the mean token count per rank (`scale_per_token`)."""
    count = torch.tensor([float(tokens)], device=device)
    if distributed:
        dist.all_reduce(count)
        count /= dist.get_world_size()
    return scale_per_token(model, count.clamp(min=1.0)[0], clip_norm)


def scale_per_token(model: nn.Module, count: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Divide the gradients by `count` (a () tensor on their device, at least 1) and clip
    them, in one multiplication: by min(1, clip_norm / (norm + 1e-6)) / count, where norm
    is the per-token gradients' (`clip_grad_norm_`'s coefficient); returns that norm. No
    host sync (a captured update runs it: `mtkit.training.graphs`)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), device=count.device)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) / count
    scale = (
        torch.ones((), device=count.device)
        if clip_norm <= 0
        else (clip_norm / (norm + 1e-6)).clamp(max=1.0)
    )
    torch._foreach_mul_(grads, scale / count)
    return norm

"""The optimizer and its schedule: AdamW with the paper's betas, the inverse-square-root
warm-up, and the per-token scaling and clipping of one update's gradients."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from mtkit.config import TrainConfig


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak` at `warmup` steps, then peak * sqrt(warmup / step): the
    paper's schedule d^-0.5 * min(step^-0.5, step * warmup^-1.5) with its peak named."""
    step = max(step, 1)
    if warmup == 0:
        return peak
    return peak * min(step / warmup, math.sqrt(warmup / step))


def adamw(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with the paper's betas (0.9, 0.98) and eps 1e-9, at the schedule's first
    learning rate; fused on CUDA."""
    return torch.optim.AdamW(
        model.parameters(), lr=inverse_sqrt_lr(1, tc.lr, tc.warmup_steps), betas=(0.9, 0.98),
        eps=1e-9, weight_decay=tc.weight_decay, fused=device.type == "cuda")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def per_token_gradients(model: nn.Module, tokens: int, clip_norm: float,
                        device: torch.device, distributed: bool) -> torch.Tensor:
    """Turn the summed gradients of one update into per-token means, clip them, and
    return their norm before clipping (non-finite when the loss was).

    Each rank's gradients hold sums over its own tokens, averaged over ranks by DDP, so
    they are divided by the mean token count per rank."""
    count = torch.tensor([float(tokens)], device=device)
    if distributed:
        dist.all_reduce(count)
        count /= dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(count.clamp(min=1.0))
    return nn.utils.clip_grad_norm_(model.parameters(),
                                    clip_norm if clip_norm > 0 else float("inf"))

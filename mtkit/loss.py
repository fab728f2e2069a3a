"""Label-smoothed cross-entropy (Szegedy et al., 2016; the paper uses eps = 0.1) (pure).

With smoothing eps over V classes the target distribution puts 1 - eps + eps/V on the
reference token and eps/V on every other token, as `F.cross_entropy(label_smoothing=eps)`:

    loss = (1 - eps) * nll + eps * mean_v(-log p_v)

Pad positions count for nothing. Sums, not means: the trainer divides by the number of
target tokens of the whole (accumulated) update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.tokenizer import PAD


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # label-smoothed loss summed over non-pad tokens (scalar)
    nll: Tensor  # plain negative log-likelihood summed over the same tokens (scalar)
    tokens: int  # non-pad target tokens


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float = 0.1,
                       ignore_index: int = PAD) -> LossOutput:
    """logits (B, T, V), target (B, T) -> summed losses over the non-pad tokens."""
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V), fp32 for a stable sum
    keep = target != ignore_index  # (B, T)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    smooth = -lprobs.mean(dim=-1)  # (B, T)
    nll = torch.where(keep, nll, 0.0).sum()
    smooth = torch.where(keep, smooth, 0.0).sum()
    return LossOutput((1.0 - eps) * nll + eps * smooth, nll, int(keep.sum()))

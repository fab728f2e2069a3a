"""Label-smoothed cross-entropy (Szegedy et al., 2016; the paper uses eps = 0.1) (pure).

With smoothing eps over V classes the target distribution q puts 1 - eps + eps/V on the
reference token and eps/V on every other token, as `F.cross_entropy(label_smoothing=eps)`:

    loss = (1 - eps) * nll + eps * mean_v(-log p_v)

Pad positions count for nothing. Sums, not means: the trainer divides by the number of
target tokens of the whole (accumulated) update.

The gradient is written by hand (`_SmoothedCrossEntropy`): d loss / d logits = p - q,
a few passes over the (tokens x V) logits where autograd through log_softmax, gather and
mean takes many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from mtkit.core.vocab import PAD

if TYPE_CHECKING:
    from mtkit.model.transformer import Projection

# Logits made at once by the projected loss: rows x V elements (32 MB in fp32), so that
# its memory does not grow with the batch; 1,024 rows of the Multi30k model's 8,000 types.
CHUNK_ELEMENTS = 1 << 23


def fp32_log_softmax(logits: Tensor) -> Tensor:
    """Log-probabilities in fp32 of logits (..., V), written in place: fp32 logits become
    them, others (bf16) are cast once and the copy becomes them. `log_softmax(logits,
    dtype=float32)` would cast into a temporary and write a third (..., V) tensor. The
    caller lets go of the logits."""
    lprobs = logits if logits.dtype == torch.float32 else logits.float()  # (..., V)
    return torch.log_softmax(lprobs, dim=-1, out=lprobs)


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # label-smoothed loss summed over non-pad tokens (scalar)
    nll: Tensor  # plain negative log-likelihood summed over the same tokens (scalar)
    tokens: int | Tensor  # non-pad target tokens (a () tensor from the dense loss)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-row smoothed loss and NLL of logits (N, V) against target (N,)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float):
        lprobs = torch.log_softmax(logits, dim=-1)  # (N, V)
        nll = -lprobs.gather(1, target[:, None]).squeeze(1)  # (N,)
        smooth = -lprobs.mean(dim=-1)  # (N,)
        ctx.save_for_backward(lprobs, target)
        ctx.eps = eps
        return (1.0 - eps) * nll + eps * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor | None, grad_nll: Tensor | None):
        lprobs, target = ctx.saved_tensors
        eps, vocab = ctx.eps, lprobs.size(1)
        if grad_loss is None:
            grad_loss = torch.zeros(lprobs.size(0), dtype=lprobs.dtype, device=lprobs.device)
        if grad_nll is None:
            grad_nll = torch.zeros_like(grad_loss)
        # d loss_i / d z_ij = p_ij - (1 - eps) [j = t_i] - eps / V
        # d nll_i  / d z_ij = p_ij - [j = t_i]
        grad = lprobs.exp()  # (N, V): probabilities
        grad.mul_((grad_loss + grad_nll)[:, None])
        grad.sub_((eps / vocab) * grad_loss[:, None])
        at_target = -((1.0 - eps) * grad_loss + grad_nll)  # (N,)
        grad.scatter_add_(1, target[:, None], at_target[:, None])
        return grad, None, None


def output_and_loss(
    projection: Projection,
    target: Tensor,
    eps: float = 0.1,
    ignore_index: int = PAD,
    dense: bool = False,
) -> LossOutput:
    """The output layer and the loss in one, as training runs them: `projection` (the
    decoder's output (B, T, D) and the output weight, the model's training forward),
    target (B, T) -> summed losses over the non-pad tokens, as `label_smoothed_nll` of
    the logits would give. The logits are made a chunk of rows at a time and their
    gradient is taken right away (`_ProjectedSmoothedCrossEntropy`), so no (tokens x V)
    tensor outlives its chunk. `dense`: without a host sync, the token count a device
    tensor (`_chunked_loss`)."""
    return _projected_nll(
        projection.hidden, projection.weight, target, eps, ignore_index, projection.bias, dense
    )


def label_smoothed_nll(
    logits: Tensor, target: Tensor, eps: float = 0.1, ignore_index: int = PAD
) -> LossOutput:
    """logits (B, T, V), target (B, T) -> summed losses over the non-pad tokens."""
    vocab = logits.size(-1)
    dtype = torch.promote_types(logits.dtype, torch.float32)  # at least fp32 for the sums
    flat = logits.reshape(-1, vocab).to(dtype)  # (B*T, V)
    loss, nll = _SmoothedCrossEntropy.apply(flat, target.reshape(-1), eps)  # (B*T,) each
    keep = target.reshape(-1) != ignore_index  # (B*T,)
    loss = torch.where(keep, loss, 0.0).sum()
    nll = torch.where(keep, nll, 0.0).sum()
    return LossOutput(loss, nll, int(keep.sum()))


def _chunked_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    ignore_index: int,
    chunk_rows: int,
    want_hidden: bool,
    want_weight: bool,
    bias: Tensor | None = None,
    dense: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """hidden (N, D), weight (V, D), target (N,) -> the summed smoothed loss and NLL over
    the rows whose target is not `ignore_index`, and (when wanted) the loss's gradients
    with respect to hidden and weight, made `chunk_rows` rows of logits at a time. A
    `bias` (V,) is fixed: added to the logits, never trained.

    Only the rows with a real target are projected (pad rows get no gradient, so none
    of their logits is made), and each chunk is written in place: its logits cast once
    to fp32, made log-probabilities, then p - q, whose last subtraction writes the
    logits' dtype (bf16 under autocast) for the two gradient products, so that autocast
    does not cast it again for each.

    `dense`: every row is projected and the pad rows' losses and gradients are masked to
    0 instead, so that nothing depends on how many rows are real: no host sync and the
    same shapes every time, as a captured CUDA graph needs (`mtkit.training.graphs`).
    Where batches are padded it makes more logits."""
    bias = None if bias is None else bias.to(hidden.dtype)
    vocab = weight.size(0)
    rows = hidden.size(0)
    keep = (target != ignore_index).float() if dense else None  # (N,)
    padded = False
    if not dense:
        real = (target != ignore_index).nonzero().squeeze(1)  # (M,) rows with a real target
        padded = real.numel() < target.numel()
    if padded:
        hidden, target = hidden.index_select(0, real), target.index_select(0, real)  # (M, .)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    nll = torch.zeros_like(loss)
    grad_hidden = torch.empty_like(hidden) if want_hidden else None  # (M, D)
    grad_weight = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        if want_weight
        else None
    )
    for start in range(0, hidden.size(0), chunk_rows):
        h = hidden[start : start + chunk_rows]  # (n, D)
        t = target[start : start + chunk_rows]  # (n,)
        logits = F.linear(h, weight, bias)  # (n, V): bf16 under autocast
        grad_dtype = logits.dtype
        lprobs = fp32_log_softmax(logits)  # (n, V)
        del logits
        row_nll = -lprobs.gather(1, t[:, None]).squeeze(1)  # (n,)
        row_loss = (1.0 - eps) * row_nll - eps * lprobs.mean(dim=-1)  # (n,)
        if keep is not None:
            mask = keep[start : start + chunk_rows]  # (n,)
            row_nll, row_loss = row_nll * mask, row_loss * mask
        loss += row_loss.sum()
        nll += row_nll.sum()
        if not (want_hidden or want_weight):
            continue
        # d loss_i / d z_ij = p_ij - (1 - eps) [j = t_i] - eps / V
        probs = lprobs.exp_()  # (n, V), in place of lprobs
        probs.scatter_add_(1, t[:, None], probs.new_full((t.size(0), 1), eps - 1.0))
        grad = probs if grad_dtype == probs.dtype else torch.empty_like(probs, dtype=grad_dtype)
        torch.sub(probs, eps / vocab, out=grad)  # (n, V)
        if keep is not None:
            grad.mul_(mask[:, None].to(grad.dtype))  # pad rows: no gradient
        del lprobs, probs
        if want_hidden:
            grad_hidden[start : start + chunk_rows] = grad @ weight  # autocast: weight cast once
        if want_weight:
            grad_weight += (grad.t() @ h).float()
    if want_hidden and padded:  # pad rows: no gradient
        grad_hidden = grad_hidden.new_zeros(rows, grad_hidden.size(1)).index_copy_(
            0, real, grad_hidden
        )
    return loss, nll, grad_hidden, grad_weight


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The output projection and the summed smoothed loss in one (`_chunked_loss`).

    The loss is the last thing a training step computes, so its gradient is known in the
    forward pass up to the scale backward brings: each chunk's d loss / d logits =
    p - q (0 on pad rows) goes at once into the gradients of hidden and weight, the two
    products the projection's backward would run anyway. Only those gradients are kept,
    (N, D) and (V, D); the chunk's logits, log-probabilities and p - q are freed."""

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        eps: float,
        ignore_index: int,
        chunk_rows: int,
        bias: Tensor | None,
        dense: bool,
    ):
        loss, nll, grad_hidden, grad_weight = _chunked_loss(
            hidden,
            weight,
            target,
            eps,
            ignore_index,
            chunk_rows,
            *ctx.needs_input_grad[:2],
            bias,
            dense,
        )
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor | None):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            None if grad_hidden is None else grad_hidden * grad_loss.to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _projected_nll(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    ignore_index: int,
    bias: Tensor | None = None,
    dense: bool = False,
) -> LossOutput:
    flat = hidden.reshape(-1, hidden.size(-1))  # (B*T, D)
    target = target.reshape(-1)  # (B*T,)
    chunk_rows = max(1, CHUNK_ELEMENTS // weight.size(0))
    if torch.is_grad_enabled():
        loss, nll = _ProjectedSmoothedCrossEntropy.apply(
            flat, weight, target, eps, ignore_index, chunk_rows, bias, dense
        )
    else:  # validation: no gradients to take
        loss, nll, _, _ = _chunked_loss(
            flat, weight, target, eps, ignore_index, chunk_rows, False, False, bias, dense
        )
    tokens = (target != ignore_index).sum()
    return LossOutput(loss, nll, tokens if dense else int(tokens))

"""Dynamic int8 matrix products for translation (`translate --precision int8`).

Each Linear layer's weight is rounded once to int8 with one scale per output row
(symmetric, to -127..127); at every call the input is rounded the same way with one
scale per row, the product runs on int8 (`torch._int_mm`, int32 sums: oneDNN's VNNI
kernels where the CPU has them, AVX2's otherwise) and is scaled back to float:

    y[i, j] = sx[i] * sw[j] * sum_k xq[i, k] * wq[j, k] + b[j]

This is what CTranslate2's `int8` compute type and PyTorch's deprecated
`quantize_dynamic` do. The embeddings stay in float (a lookup, no product); the output
projection, tied to the target embedding, gets an int8 copy. Outputs differ from fp32 in
a few percent of sentences (docs/translation.md, "Precision", has the share and the BLEU
difference).

Not every CPU multiplies int8 exactly at full range. Without VNNI instructions (AVX2, or
AVX-512 without VNNI; no AVX-VNNI or AMX) oneDNN shifts the inputs to unsigned bytes and
adds pairs of byte products in 16 bits (`vpmaddubsw`), which saturate: 255 x 127 x 2 does
not fit, and most products of full-range int8 matrices come out wrong there.
`weight_range()` finds out by multiplying numbers at the edge of the range and comparing
with exact integer arithmetic, once per process: where full-range weights are not exact,
weights are rounded to -63..63 (255 x 63 x 2 fits), as PyTorch's `reduce_range` does for the
same reason.

`quantize(model)` turns a model's Linear layers, and its output projection, into
`Int8Linear`s in place; `int8_supported()` says whether this torch has the kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

QMAX = 127  # symmetric: -127..127 (no -128, so that negating never overflows)
REDUCED_QMAX = 63  # weights where full-range products saturate (`weight_range`)


def quantize_rows(x: Tensor, qmax: int = QMAX) -> tuple[Tensor, Tensor]:
    """x (N, K) float -> (int8 (N, K), scale (N, 1) float32) with x ~ q * scale. Each
    row's largest magnitude becomes `qmax`, so no value needs clamping."""
    # max |x| as the larger of max x and -min x: two reads of x, where abs() would
    # write a copy of it first
    amax = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_())
    amax = amax.float().clamp_(min=1e-8)  # (N, 1)
    q = x.float().mul(qmax / amax).round_().to(torch.int8)  # (N, K)
    return q, amax / qmax


def products_exact(qmax: int, mm: Callable[[Tensor, Tensor], Tensor] | None = None) -> bool:
    """Whether `mm` (default `torch._int_mm`) multiplies full-range inputs (-127..127)
    by weights in -qmax..qmax exactly: inputs at both edges and random ones, weights of
    both signs at the edge, against the same product in int64."""
    mm = mm or torch._int_mm
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-QMAX, QMAX + 1, (32, 256), dtype=torch.int8, generator=generator)
    x[0], x[1] = QMAX, -QMAX  # (32, 256): the largest unsigned bytes once shifted
    w = torch.randint(-qmax, qmax + 1, (256, 64), dtype=torch.int8, generator=generator)
    w[:, 0], w[:, 1] = qmax, -qmax  # (256, 64)
    return torch.equal(mm(x, w).long(), x.long() @ w.long())


@functools.cache
def weight_range() -> int:
    """The largest weight magnitude int8 layers round to on this CPU: 127 where
    full-range products are exact, else 63 (see the module's docstring)."""
    return QMAX if products_exact(QMAX) else REDUCED_QMAX


class Int8Linear(nn.Module):
    """`nn.Linear` with an int8 weight (one scale per output feature, magnitudes up to
    `qmax`, default `weight_range()`) and inputs rounded to int8 per row at each call.
    `weight_t` is stored (in, out), the layout the int8 product reads fastest."""

    def __init__(self, weight: Tensor, bias: Tensor | None, qmax: int | None = None):
        super().__init__()
        q, scale = quantize_rows(weight.detach(), qmax or weight_range())  # (out, in), (out, 1)
        self.register_buffer("weight_t", q.t().contiguous())  # (in, out) int8
        self.register_buffer("scale", scale.reshape(1, -1))  # (1, out)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8Linear:
        return cls(linear.weight, linear.bias)

    @classmethod
    def stacked(cls, layers: list[Int8Linear]) -> Int8Linear:
        """The layers (of one input size) as one, outputs side by side: exact, since each
        output feature keeps its own scale (`attention.stacked_linear`)."""
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.register_buffer("weight_t", torch.cat([la.weight_t for la in layers], dim=1))
        out.register_buffer("scale", torch.cat([la.scale for la in layers], dim=1))
        biases = [la.bias for la in layers]
        out.register_buffer("bias", None if any(b is None for b in biases) else torch.cat(biases))
        out.in_features = layers[0].in_features
        out.out_features = sum(la.out_features for la in layers)
        return out

    def rows(self, ids: Tensor) -> Int8Linear:
        """The layer for the output features `ids` (A,) only: the same values there."""
        out = type(self).__new__(type(self))
        nn.Module.__init__(out)
        out.register_buffer("weight_t", self.weight_t[:, ids].contiguous())  # (in, A)
        out.register_buffer("scale", self.scale[:, ids].contiguous())  # (1, A)
        out.register_buffer("bias", None if self.bias is None else self.bias[ids])
        out.in_features, out.out_features = self.in_features, ids.numel()
        return out

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out), float32 (or x's dtype under no autocast)."""
        lead = x.shape[:-1]
        q, sx = quantize_rows(x.reshape(-1, self.in_features))  # (N, in), (N, 1)
        sums = torch._int_mm(q, self.weight_t)  # (N, out) int32
        # Cast to float in place (the same 4 bytes an element), then scaled in place:
        # an int32 tensor times a float one would cast inside the product, element by
        # element, and a new tensor would be new memory at every step. The same values.
        y = sums.view(torch.float32).copy_(sums).mul_(sx).mul_(self.scale)  # (N, out)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*lead, self.out_features)  # (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


@functools.cache
def int8_supported() -> bool:
    """Whether this torch runs int8 products on a CPU (`torch._int_mm`) exactly, at least
    with weights in the reduced range."""
    try:
        return products_exact(REDUCED_QMAX)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def quantize(model: nn.Module, release: Callable[[Tensor], None] | None = None) -> nn.Module:
    """Every `nn.Linear` of `model` replaced by an `Int8Linear`, and the output projection
    of a `Transformer` (tied to the target embedding) given an int8 copy (its
    `output_int8`); the float weights of the Linear layers are let go, and handed to
    `release` once rounded (a loaded model's weights are a checkpoint's mapped pages:
    `checkpoint.MappedFile.release` gives them back). In place; returns the model (in
    eval mode: it no longer trains)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear.of(child))
            if release is not None:
                release(child.weight)
        else:
            quantize(child, release)
    if hasattr(model, "output_int8"):
        bias = getattr(model, "output_bias", None)
        model.output_int8 = Int8Linear(model.output_weight, bias)
    return model.eval()

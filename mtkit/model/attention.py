"""Attention and dropout, the model's two pieces that `mtkit.tuning.attention` measures
and tunes.

`MultiHeadAttention` attends in one way, `attend`, with `F.scaled_dot_product_attention`
or with explicit matrix products (`matmul_attention`), the same function of its inputs;
which one a run uses is measured. Watched (`watching`: `mtkit explain`, alignments), it
attends stage by stage (`observed_attention`). `dropout` draws its CPU masks from 16-bit random
integers. Both were chosen by profiling a bf16 training step (docs/performance.md);
`mtkit.model.transformer` builds on them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtkit.model.int8 import Int8Linear


def dropout(x: Tensor, p: float) -> Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1/(1-p).
    On a CPU the mask comes from 16-bit random integers, four to each 64-bit draw of the
    generator (`keep_mask`): half the generator's output that `torch.rand` takes (one
    32-bit number an element), and faster for a whole dropout. p is then rounded
    to a multiple of 1/65,536 (0.1 -> 0.100006), and the kept elements are scaled by
    exactly what is kept."""
    if p == 0.0:
        return x
    if x.device.type == "cpu":
        keep, p = keep_mask(x.shape, p, x.device)  # (same shape as x)
    else:
        keep = torch.rand(x.shape, device=x.device) >= p  # (same shape as x)
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[Tensor, float]:
    """A bool mask of `shape`, False with probability p rounded to a multiple of 1/65,536,
    and that probability. Each element compares a uniform 16-bit integer, four of which
    make one draw of the full 64-bit range (all 64 bits uniform; `random_()` without a
    range would leave the top bit 0)."""
    n = math.prod(shape)
    dropped = round(p * 65536)  # of the 65,536 values of a draw
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    draws = words.view(torch.int16)[:n].view(shape)  # uniform over -32768..32767
    return draws >= dropped - 32768, dropped / 65536


class Dropout(nn.Module):
    """Inverted dropout (`dropout`), as `nn.Dropout`, its mask drawn from 16-bit random
    integers on a CPU: a third of the time of `nn.Dropout`'s Bernoulli sampling."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p) if self.training else x

    def extra_repr(self) -> str:
        return f"p={self.p}"


ATTENTION_KERNELS = ("sdpa", "matmul")


def stacked_linear(x: Tensor, layers: list[nn.Linear]) -> tuple[Tensor, ...]:
    """Each of `layers` (Linear layers of one input size) applied to x (..., D), as one
    matrix product with their weights stacked: (..., D) -> one (..., out) per layer. One
    product instead of several, and x cast once under autocast: the queries, keys and values
    of self-attention this way make a bf16 training step faster. The layers keep their own
    weights, so checkpoints are unchanged. Int8 layers (`mtkit.model.int8`, translation) are
    stacked as int8.

    A translation engine's layers (`keep_stacked_weights`) keep their stack, on the first
    layer, and use it again while no weight changes, so a search's steps do not stack
    the weights anew; int8's input is then rounded once."""
    sizes = [layer.out_features for layer in layers]
    if torch.is_grad_enabled() or not getattr(layers[0], "keep_stacked", False):
        return _stack(layers)(x).split(sizes, dim=-1)
    if torch.compiler.is_compiling():  # a compiled step (`mtkit.tuning.compile`): the
        kept = getattr(layers[0], "_stacked", None)  # weights are final, the stack unchecked
        return (kept.product if kept is not None else _stack(layers))(x).split(sizes, dim=-1)
    tensors = [t for layer in layers for t in (*layer.parameters(), *layer.buffers())]
    state = [(0 if t.is_inference() else t._version, t.data_ptr(), t.dtype) for t in tensors]
    kept: KeptStack | None = getattr(layers[0], "_stacked", None)
    if (
        kept is None
        or kept.state != state
        or any(a is not b for a, b in zip(kept.tensors, tensors, strict=True))
    ):
        kept = KeptStack(tensors, state, _stack(layers), [t.untyped_storage() for t in tensors])
        object.__setattr__(layers[0], "_stacked", kept)  # not a submodule: no state_dict entry
    return kept.product(x).split(sizes, dim=-1)


class KeptStack(NamedTuple):
    """A translation engine's stacked layers (`stacked_linear`) and what they were made
    of. The tensors and their storages are held, so no weight's memory is freed and
    reused at the same address while the stack lives: a tensor replaced, written in place
    (its version) or given new memory (`.data =`) makes a new stack. Not seen: a write
    through `.data` in place, or into an inference-mode tensor."""

    tensors: list[Tensor]
    state: list[tuple]  # (version, data_ptr, dtype) of each tensor when stacked
    product: Callable[[Tensor], Tensor]
    storages: list  # the tensors' storages, held


def keep_stacked_weights(model: nn.Module) -> nn.Module:
    """Translation's promise that `model`'s weights no longer change: its stacked
    products (`stacked_linear`) then stack their weights once and keep the stack, at the
    cost of holding those weights twice (3 MB for the Multi30k model in bf16). Training
    and validation never keep one. In place; returns the model."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, Int8Linear)):
            module.keep_stacked = True
    return model


def _stack(layers: list[nn.Linear]) -> Callable[[Tensor], Tensor]:
    """The layers as one: their outputs side by side."""
    if isinstance(layers[0], Int8Linear):
        return Int8Linear.stacked(layers)
    weight = torch.cat([layer.weight for layer in layers])  # (sum of out, D)
    bias = torch.cat([layer.bias for layer in layers])  # (sum of out,)
    return functools.partial(F.linear, weight=weight, bias=bias)


def matmul_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float = 0.0
) -> Tensor:
    """softmax(QK^T / sqrt(K), masked) V with dropout `p` on the weights, as explicit matrix
    products: what `scaled_dot_product_attention` computes (equal in fp32 up to rounding).
    On some CPUs it is the faster of the two in bf16 (`mtkit.tuning.attention` measures which).
    q (B, H, T, K), k and v (B, H, S, K), mask broadcasting to (B, H, T, S), True = may
    attend. Returns (B, H, T, K)."""
    scores = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)  # (B, H, T, S)
    if causal:
        t, s = scores.shape[-2:]
        ahead = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1)  # (T, S)
        scores = scores.masked_fill(ahead, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = dropout(torch.softmax(scores, dim=-1), p)  # (B, H, T, S)
    return weights @ v  # (B, H, T, K)


def observed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    see: Callable[[str, Tensor], None],
) -> Tensor:
    """What `scaled_dot_product_attention` computes, one stage at a time, each shown to
    `see(stage name, tensor)` (`mtkit explain`; the same result, no dropout). q (B, H,
    T, K), k and v (B, H, S, K) -> (B, H, T, K)."""
    see("queries split into heads", q)
    see("keys split into heads", k)
    see("values split into heads", v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    see("scores QK^T / sqrt(d_k)", scores)
    t, s = scores.shape[-2:]
    allowed = torch.ones(t, s, dtype=torch.bool, device=q.device)  # (T, S)
    if causal:
        allowed = torch.tril(allowed)
    if mask is not None:
        allowed = allowed & mask  # (B, 1, T, S)
    see("causal mask" if causal else "padding mask", allowed)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    see("attention weights softmax", weights)  # (B, H, T, S)
    out = weights @ v  # (B, H, T, K)
    see("weighted values", out)
    return out


Observer = Callable[[str, Tensor], None]  # observer(stage name, tensor)

# Which attentions are watched, and by whom: of this thread (or asyncio task) only.
_WATCHERS: ContextVar[Mapping[nn.Module, Observer]] = ContextVar(
    "mtkit_attention_watchers", default=MappingProxyType({})
)


def watched() -> bool:
    """Whether any attention is watched in this thread (or task): `watching`."""
    return bool(_WATCHERS.get())


@contextmanager
def watching(observers: Mapping[MultiHeadAttention, Observer]) -> Iterator[None]:
    """Within the block, each attention of `observers` shows its stages to its observer
    (its `observer`), in this thread (or asyncio task) alone: a model shared by threads
    is watched by each pass for itself, and passes of other threads run as unwatched
    (`mtkit.search.alignment`'s pass beside another thread's search, or its own). Nests:
    an inner block adds to (or replaces) the outer one's observers."""
    token = _WATCHERS.set(MappingProxyType({**_WATCHERS.get(), **observers}))
    try:
        yield
    finally:
        _WATCHERS.reset(token)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads: queries, keys and values are projected
    and split into heads (`project_qkv` for self-attention; `project_q` and `project_kv`
    for cross-attention, whose keys/values a search computes once per sentence), then
    `attend`, the one way to attend: with `F.scaled_dot_product_attention` (`kernel`
    "sdpa") or `matmul_attention` ("matmul"), the same function of its inputs; which one
    a run uses is measured (`mtkit.tuning.attention`).

    Two hooks for others: `observer`, what sees each stage where `watching` names this
    attention (`mtkit explain`, `search.alignment`): of the thread that watches, never
    state of the shared model; and `guided_head`, set by guided alignment training."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.kernel = "sdpa"  # or "matmul": `Transformer.use_attention`
        # Guided alignment (`train.guided_alignment`): while training, the weights of
        # this head are kept in `guided` (B, T, S), with their gradient, for the loss.
        self.guided_head: int | None = None
        self.guided: Tensor | None = None

    @property
    def observer(self) -> Observer | None:
        """What sees each stage of this attention in this thread (or task): the observer
        `watching` gave it, or None. A compiled step (`mtkit.tuning.compile`) sees none: it
        runs only where nothing watches."""
        if torch.compiler.is_compiling():
            return None
        return _WATCHERS.get().get(self)

    @observer.setter
    def observer(self, value: Observer | None) -> None:
        raise AttributeError(
            "an attention's observer is of one pass, not of the model: watch it with "
            "mtkit.model.attention.watching({attention: observer})"
        )

    def split_heads(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, L, K)

    def project_q(self, x: Tensor) -> Tensor:
        """Queries of x (B, T, D), split into heads: (B, H, T, K)."""
        return self.split_heads(self.q_proj(x))

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x (B, S, D), split into heads: 2 x (B, H, S, K)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, L, D) for self-attention, in one matrix
        product (`stacked_linear`), split into heads: 3 x (B, H, L, K). Watched by `mtkit
        explain` (an observer is set), it runs the three Linear layers, which it hooks."""
        if self.observer is not None:
            return self.project_q(x), *self.project_kv(x)
        q, k, v = stacked_linear(x, [self.q_proj, self.k_proj, self.v_proj])  # (B, L, D)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False
    ) -> Tensor:
        """Queries q (B, H, T, K) over keys/values (B, H, S, K), heads concatenated and
        projected out; mask broadcasts to (B, H, T, S), True = may attend; `causal`: each
        query sees the keys up to its own position. Returns (B, T, D)."""
        p = self.dropout if self.training else 0.0
        if self.guided_head is not None and self.training:
            h = self.guided_head
            scores = q[:, h] @ k[:, h].transpose(-2, -1) * (self.head_dim**-0.5)  # (B, T, S)
            if mask is not None:
                scores = scores.masked_fill(~mask[:, 0], float("-inf"))
            self.guided = torch.softmax(scores.float(), dim=-1)  # (B, T, S)
        observer = self.observer
        if observer is not None:
            out = observed_attention(q, k, v, mask, causal, observer)  # (B, H, T, K)
        elif self.kernel == "matmul":
            out = matmul_attention(q, k, v, mask, causal, p)  # (B, H, T, K)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p
            )  # (B, H, T, K)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)  # (B, T, D)
        if observer is not None:
            observer("heads concatenated", out)
        return self.out_proj(out)

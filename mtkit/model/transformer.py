"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), batch-first.

    projection = model(src, tgt_in)                             # training: a `Projection`
    memory, src_mask = model.encode(src)                        # (B, S, D), (B, S)
    logits = model.decode(tgt_in, memory, src_mask)             # (B, T, V)  teacher-forced
    logits, cache = model.decode_step(token, memory, src_mask, cache)   # (B*W, V) search
    hidden, cache = model.decode_hidden(token, memory, src_mask, cache) # (B*W, D)
    logits = model.project(hidden)                              # (B*W, V)

Training calls the model (`forward`, as DistributedDataParallel needs) and gets one type,
a `Projection`: the decoder's output and the output layer's weights, from which the loss
makes the logits a chunk at a time (`mtkit.model.loss.output_and_loss`, the fused output
layer and loss), so the logits of a whole batch never exist at once. `decode` makes them
all at once (`mtkit explain`). `decode_step`, search's, is `project` after
`decode_hidden`; the two halves are for the step models that wrap a Transformer: the
captured decoder (`mtkit.search.captured` replays `decode_hidden` as a CUDA graph) and a
lexical shortlist (`mtkit.search.shortlist` projects onto a batch's allowed tokens only,
`output_rows`).

The model scores; search decides (beam size, length penalty, limits, which rows go on:
`mtkit.search`). What of decoding the model does carry, it carries where doing it
elsewhere would cost a copy or a second pass:

- rows: `decode_step` takes W consecutive rows per sentence (its beams or samples)
  against one memory row per sentence, and `DecoderLayer` folds them into the queries
  of one cross-attention over the sentence's source, so that no search copies a
  source's keys/values per beam;
- caches: a step's keys/values go into the cache the caller hands in, seen through
  `cache.DecoderCache` (`begin`, `cross`, `update`, `advanced`): the `BeamCache` of
  offline search, which search reorders with `index_select`; a `PreallocatedCache` in
  fixed shapes, for captured steps; or the `SlotCache` of continuous batching
  (`mtkit.serving.stream`), which `cross_kv` and `slot_cache` make and fill;
- int8 translation: `output_int8`, an int8 copy of the output projection
  (`mtkit.model.int8.quantize`);
- `mtkit explain` and alignments: an attention that a pass watches
  (`mtkit.model.attention.watching`, of that thread alone) shows its `observer` its stages.

Masks are bool, True = may attend. Departures from the paper are named in `ModelConfig`:
`norm: pre` (LayerNorm before each sublayer, plus a final one per stack), `activation:
gelu`, `positions: learned`. Its attention and dropout are `mtkit.model.attention`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtkit.core.config import ModelConfig
from mtkit.core.vocab import PAD
from mtkit.model.attention import ATTENTION_KERNELS, Dropout, MultiHeadAttention, stacked_linear
from mtkit.model.cache import BeamCache, DecoderCache, SlotCache


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(...): (length, D)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )  # (D/2,)
    table = torch.zeros(length, d_model)  # (L, D)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table


def split_sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """Marian's layout of the same sines and cosines: PE[pos, i] = sin(pos / 10000^(2i/D))
    for i < D/2, PE[pos, D/2 + i] = cos(...): (length, D)."""
    table = sinusoidal_positions(length, d_model)  # (L, D), interleaved
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)  # (L, D)


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(D), plus positions, then dropout."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig):
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(cfg.d_model)
        if cfg.positions == "learned":
            self.learned = nn.Embedding(cfg.max_positions, cfg.d_model)
            nn.init.normal_(self.learned.weight, std=cfg.d_model**-0.5)
        else:
            self.learned = None
            table = (
                split_sinusoidal_positions
                if cfg.positions == "sinusoidal_split"
                else sinusoidal_positions
            )(cfg.max_positions, cfg.d_model)
            self.register_buffer("sinusoidal", table, persistent=False)
        self.max_positions = cfg.max_positions
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start: int | Tensor = 0, bounded: bool = False) -> Tensor:
        """ids (B, L) at positions start..start+L-1 -> (B, L, D). `start` may also give
        each row its own position, (B,), for one token per row (L = 1), or one position
        for all rows as a () tensor. `bounded`: the caller knows the positions are within
        the model's (a fixed-shape cache: `cache.PreallocatedCache`), so a tensor's are
        not read back to be checked (on a GPU, a wait)."""
        length = ids.size(1)
        if not bounded:
            last = (int(start.max()) if isinstance(start, Tensor) else start) + length
            if last > self.max_positions:
                raise ValueError(
                    f"sequence of {last} tokens exceeds model.max_positions={self.max_positions}"
                )
        x = self.tokens(ids) * self.scale  # (B, L, D)
        table = self.learned.weight if self.learned is not None else self.sinusoidal
        if isinstance(start, Tensor) and start.dim() == 0:
            pos = table.index_select(0, start.view(1))  # (1, D)
        elif isinstance(start, Tensor):
            pos = table.index_select(0, start)[:, None]  # (B, 1, D)
        else:
            pos = table[start : start + length]  # (L, D)
        return self.dropout(x + pos.to(x.dtype))


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(D, F) -> ReLU (or GELU, or SiLU) -> Linear(F, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inner = nn.Linear(cfg.d_model, cfg.ffn_dim)
        self.outer = nn.Linear(cfg.ffn_dim, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.inner(x)  # (B, L, F)
        if self.activation is F.relu and not torch.is_grad_enabled():
            hidden = hidden.relu_()  # a new tensor no one else holds: in place, no copy
        else:
            hidden = self.activation(hidden)
        return self.outer(hidden)  # (B, L, D)


class Sublayer(nn.Module):
    """Residual connection around a sublayer f with dropout and LayerNorm: post-norm
    LN(x + drop(f(x))) as in the paper, or pre-norm x + drop(f(LN(x))).

    Used as `after(x, f(before(x)))`, so that f may also return other values."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)
        self.pre_norm = cfg.norm == "pre"

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def after(self, x: Tensor, out: Tensor) -> Tensor:
        x = x + self.dropout(out)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg)
        self.attn_block, self.ffn_block = Sublayer(cfg), Sublayer(cfg)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) -> (B, S, D)."""
        q, k, v = self.self_attn.project_qkv(self.attn_block.before(x))  # (B, H, S, K) each
        x = self.attn_block.after(x, self.self_attn.attend(q, k, v, mask))
        return self.ffn_block.after(x, self.ffn(self.ffn_block.before(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg)
        self.self_block, self.cross_block, self.ffn_block = (
            Sublayer(cfg),
            Sublayer(cfg),
            Sublayer(cfg),
        )

    def forward(
        self,
        y: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        mask: Tensor,
        cache: DecoderCache | None = None,
        index: int = 0,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """y (B*W, T, D): new target positions, W consecutive rows per sentence (W > 1
        in a beam search); memory_kv: cross-attention keys/values (B, H, S, K), one per
        sentence; mask (B, 1, 1, S); cache: the decoder's cache, this layer the `index`th
        of the stack (T = 1), or None (teacher forcing). Returns the output (B*W, T, D)
        and the self-attention keys/values of all positions so far (B*W, H, t+T, K)."""
        h = self.self_block.before(y)
        # Without a cache the T positions attend causally; with one, the single new
        # position sees all earlier ones (of its own sentence: `self_mask`). Targets are
        # right-padded, so no pad key lies before a real query and no padding mask is
        # needed.
        q, k, v = self.self_attn.project_qkv(h)  # (B*W, H, T, K) each
        if cache is None:
            out = self.self_attn.attend(q, k, v, causal=y.size(1) > 1)
        else:  # one step (T = 1)
            k, v, self_mask = cache.update(index, k, v)  # (B*W, H, t+1, K), mask or None
            out = self.self_attn.attend(q, k, v, self_mask)
        y = self.self_block.after(y, out)
        h = self.cross_block.before(y)
        # In a search, a sentence's rows (its beams) share its source keys/values, held
        # once: its rows' positions are then queries of one attention over its source.
        rows, length, d = h.shape
        sentences = memory_kv[0].size(0)
        q = h.reshape(sentences, rows // sentences * length, d)  # (B, W*T, D)
        q = self.cross_attn.project_q(q)  # (B, H, W*T, K)
        out = self.cross_attn.attend(q, *memory_kv, mask)  # (B, W*T, D)
        y = self.cross_block.after(y, out.reshape(rows, length, d))  # (B*W, T, D)
        return self.ffn_block.after(y, self.ffn(self.ffn_block.before(y))), (k, v)


class Projection(NamedTuple):
    """Logits not yet made: the decoder's output (B, T, D), the output weight (V, D) and
    the output bias (V,) or None. What training's forward returns, for the loss to make
    the logits a chunk at a time (`mtkit.model.loss.output_and_loss`)."""

    hidden: Tensor
    weight: Tensor
    bias: Tensor | None = None


class Transformer(nn.Module):
    """The encoder-decoder; its ways out are in the module's docstring."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError("shared embeddings need one vocabulary for both sides")
        self.cfg = cfg
        tgt_tokens = nn.Embedding(tgt_vocab_size, cfg.d_model, padding_idx=PAD)
        src_tokens = (
            tgt_tokens
            if cfg.share_embeddings
            else nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=PAD)
        )
        self.src_embed = Embedding(src_tokens, cfg)
        self.tgt_embed = Embedding(tgt_tokens, cfg)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        pre = cfg.norm == "pre"  # pre-norm stacks end with a LayerNorm; post-norm ones do not
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        # A fixed bias on the logits (`output_bias`): a buffer, saved, never trained.
        self.register_buffer(
            "output_bias", torch.zeros(tgt_vocab_size) if cfg.output_bias else None
        )
        # An int8 copy of the output projection, set by `mtkit.model.int8.quantize` (translation).
        self.output_int8: nn.Module | None = None
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        for emb in {self.src_embed.tokens, self.tgt_embed.tokens}:
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def use_attention(self, kernel: str) -> Transformer:
        """Attend with `kernel` ("sdpa" or "matmul", `ATTENTION_KERNELS`) in every layer."""
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.kernel = kernel
        return self

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection, tied to the target embedding: (V, D)."""
        return self.tgt_embed.tokens.weight

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_mask (B, S) (True at real tokens)."""
        src_mask = src != PAD  # (B, S)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        x = self.src_embed(src)  # (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        return self.encoder_norm(x), src_mask

    def cross_kv(self, memory: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Each decoder layer's cross-attention keys and values: per layer (B, H, S, K),
        all in one matrix product (`stacked_linear`) on a CPU or without gradients.
        Layer by layer where `mtkit explain` watches them, and in training on a GPU:
        there one product would hold every layer's gradients of them until the
        backward pass reaches the first layer (more memory; later DDP all-reduce)."""
        attns = [layer.cross_attn for layer in self.decoder_layers]
        if any(a.observer is not None for a in attns) or (
            torch.is_grad_enabled() and memory.device.type != "cpu"
        ):
            kvs = [a.project_kv(memory) for a in attns]
            return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)
        out = stacked_linear(memory, [p for a in attns for p in (a.k_proj, a.v_proj)])
        return (
            tuple(a.split_heads(k) for a, k in zip(attns, out[0::2], strict=True)),
            tuple(a.split_heads(v) for a, v in zip(attns, out[1::2], strict=True)),
        )

    def project(self, y: Tensor) -> Tensor:
        if self.output_int8 is not None:  # int8 translation (`mtkit.model.int8`)
            return self.output_int8(self.decoder_norm(y))  # (..., V)
        bias = None if self.output_bias is None else self.output_bias.to(y.dtype)
        return F.linear(self.decoder_norm(y), self.output_weight, bias)  # (..., V)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding: tgt_in (B, T) -> logits (B, T, V)."""
        return self.project(self._decoder_output(tgt_in, memory, src_mask))  # (B, T, V)

    def _decoder_output(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """The decoder stack's output for tgt_in (B, T), before its final norm: (B, T, D)."""
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        y = self.tgt_embed(tgt_in)  # (B, T, D)
        keys, values = self.cross_kv(memory)  # per layer (B, H, S, K)
        for layer, k, v in zip(self.decoder_layers, keys, values, strict=True):
            y, _ = layer(y, (k, v), attn_mask)
        return y

    def slot_cache(
        self,
        sources: tuple[tuple[Tensor, ...], tuple[Tensor, ...]],
        slots: int,
        columns: int,
        source_capacity: int,
        fixed: bool = False,
    ) -> SlotCache:
        """Free slots with these capacities, for continuous batching (`serving.stream`),
        for sources like `sources` (keys and values from `cross_kv`): in their shapes per
        head, dtype and device; `fixed`: stepped in fixed shapes (`SlotCache.fixed`). A
        method, so that an ensemble gives each model its own."""
        return SlotCache.empty(sources[0], slots, columns, source_capacity, fixed)

    def decode_step(
        self,
        token: Tensor,
        memory: Tensor | None,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, DecoderCache]:
        """One step: token (B*W,) is the last target token of each row (bos first), W
        consecutive rows per sentence of memory (B, S, D) and src_mask (B, S); returns
        the next token's logits (B*W, V) and the cache after the step. memory is read at
        the first step only (cache None: a `BeamCache` is made of it); the cache holds
        its keys/values, so later steps may pass None. A `SlotCache` steps its first B
        slots, with src_mask (B, S) theirs, and is written in place."""
        y, cache = self.decode_hidden(token, memory, src_mask, cache)  # (B*W, D)
        return self.project(y), cache  # (B*W, V)

    def decode_hidden(
        self,
        token: Tensor,
        memory: Tensor | None,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, DecoderCache]:
        """`decode_step` up to the output projection: the decoder stack's output (B*W, D)
        (before its final norm) and the cache after the step."""
        if cache is None:
            cache = BeamCache.first(*self.cross_kv(memory))
        start = cache.begin(token.size(0))  # (), () tensor or (B*W,)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        bounded = cache.fixed_shapes  # its positions within the model's
        y = self.tgt_embed(token[:, None], start, bounded)  # (B*W, 1, D)
        new_k, new_v = [], []
        for i, layer in enumerate(self.decoder_layers):
            memory_kv = cache.cross(i, src_mask.size(1))  # (B, H, S, K) each
            y, (k, v) = layer(y, memory_kv, attn_mask, cache, i)  # (B*W, 1, D)
            new_k.append(k)  # (B*W, H, t+1, K)
            new_v.append(v)
        return y[:, 0], cache.advanced(tuple(new_k), tuple(new_v))

    @property
    def vocab_size(self) -> int:
        """V, the target vocabulary's size (the output projection's rows)."""
        return self.output_weight.size(0)

    def output_rows(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        """The output projection onto the target `ids` (A,) only, as a function of the
        decoder's output (..., D) -> (..., A): `project`'s columns `ids`, with the rows
        of its weight (or of its int8 copy) taken once (a lexical shortlist,
        `mtkit.search.shortlist`)."""
        norm = self.decoder_norm
        if self.output_int8 is not None:
            layer = self.output_int8.rows(ids)
            return lambda y: layer(norm(y))
        weight = self.output_weight[ids]  # (A, D)
        bias = None if self.output_bias is None else self.output_bias[ids]
        return lambda y: F.linear(norm(y), weight, None if bias is None else bias.to(y.dtype))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Projection:
        """Training forward: src (B, S), tgt_in (B, T) -> the `Projection` that makes the
        logits (B, T, V), for the loss to make a chunk at a time
        (`mtkit.model.loss.output_and_loss`)."""
        memory, src_mask = self.encode(src)
        y = self._decoder_output(tgt_in, memory, src_mask)  # (B, T, D)
        return Projection(self.decoder_norm(y), self.output_weight, self.output_bias)


def alignment_layer(model: Transformer) -> int:
    """The decoder layer guided alignment trains, and a guided model's word alignments
    are read from (`mtkit.search.alignment`): the second-to-last (the last one of a
    one-layer decoder), Garg et al.'s (2019) choice, since the last layer attends to
    what it predicts less sharply."""
    return max(model.cfg.decoder_layers - 2, 0)


def guided_attention(model: Transformer):
    """The cross-attention whose head 0 guided alignment trains."""
    return model.decoder_layers[alignment_layer(model)].cross_attn


def build_model(
    cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, initialize: bool = True
) -> Transformer:
    """A new Transformer, its weights drawn at random; with `initialize` False they are
    left as `torch.empty` gives them, unwritten, for weights that a checkpoint then
    assigns (`load_state_dict(assign=True)`): memory that is never written is never
    made resident, so a loaded model holds its weights once, not twice."""
    if initialize:
        return Transformer(cfg, src_vocab_size, tgt_vocab_size)
    with unwritten_parameters():
        return Transformer(cfg, src_vocab_size, tgt_vocab_size)


# The initializers that torch's layers and `Transformer._init_weights` call.
INITIALIZERS = (
    "uniform_",
    "normal_",
    "xavier_uniform_",
    "kaiming_uniform_",
    "zeros_",
    "ones_",
    "constant_",
)


@contextmanager
def unwritten_parameters() -> Iterator[None]:
    """Within: `nn.init`'s initializers do nothing (as Hugging Face's `no_init_weights`),
    so new layers keep their parameters unwritten. Only for building a model whose every
    weight is then replaced; not thread-safe (it swaps module functions)."""
    saved = {name: getattr(nn.init, name) for name in INITIALIZERS}
    for name in INITIALIZERS:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def count_parameters(model: nn.Module) -> int:
    """All parameters (trainable or not), shared tensors counted once."""
    return sum(p.numel() for p in model.parameters())

"""`mtkit explain`: see inside the Transformer, from the real model.

- `trace_shapes` runs one small batch through the model with forward hooks (and each
  attention's step-by-step observer) and records every stage in data-flow order: its
  name, its shape with named axes, and optionally its values.
- `parameter_table` lists parameters per component with the closed-form count beside
  each, totalling `sum(p.numel() for p in model.parameters())`.
- `attention_maps` collects every layer's and head's attention weights for one
  sentence pair, and `plot_attention` draws them as PNG heatmaps (matplotlib, optional).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from mtkit.core.atomic import atomic_file
from mtkit.core.config import ModelConfig
from mtkit.core.search_options import DEFAULTS, SearchOptions
from mtkit.core.vocab import EOS, Vocab
from mtkit.data.batching import Batch, collate
from mtkit.model.attention import MultiHeadAttention, Observer, watching
from mtkit.model.loss import label_smoothed_nll
from mtkit.model.transformer import Transformer, count_parameters
from mtkit.search.alignment import teacher_forced_attention
from mtkit.search.beam import greedy_search

DEFAULT_PAIRS = [
    ("A dog runs.", "Ein Hund rennt."),
    ("Two men are talking.", "Zwei Männer unterhalten sich."),
]


@dataclass(frozen=True)
class Stage:
    name: str  # what the tensor is, e.g. "encoder layer 0 / self-attention / scores"
    shape: tuple[int, ...]
    axes: str  # the axes named, e.g. "(B, H, T, S)"
    values: Tensor | None = None  # a detached copy, when asked for


def hashed_ids(text: str, vocab_size: int) -> list[int]:
    """Stand-in token ids (one per word) for a model whose tokenizer is not trained yet."""
    return [
        4 + int(hashlib.md5(w.encode()).hexdigest(), 16) % (vocab_size - 4) for w in text.split()
    ]


def make_batch(
    pairs: list[tuple[str, str]], src_vocab: Vocab | None, tgt_vocab: Vocab | None, vocab_size: int
) -> Batch:
    def ids(vocab, text):
        return vocab.encode([text])[0] if vocab is not None else hashed_ids(text, vocab_size)

    return collate([(np.array(ids(src_vocab, s)), np.array(ids(tgt_vocab, t))) for s, t in pairs])


class _Recorder:
    """Collects stages; knows the axis names of each kind of tensor."""

    def __init__(self, cfg: ModelConfig, values: bool):
        self.stages: list[Stage] = []
        self.values = values
        self.cfg = cfg

    def add(self, name: str, tensor: Tensor, axes: str) -> None:
        self.stages.append(
            Stage(name, tuple(tensor.shape), axes, tensor.detach().clone() if self.values else None)
        )


def _axes(length: str, last: str = "D") -> str:
    return f"(B, {length}, {last})"


# The recorder of the trace under way in this thread (or task): a model's forward hooks
# are the model's, seen by every thread that runs it, and write into this one only
_TRACING: ContextVar[_Recorder | None] = ContextVar("mtkit_explain_tracing", default=None)


class _Hooks:
    """Forward hooks and attention observers that write into a `_Recorder`: the hooks
    of the tracing thread's passes only (`_TRACING`), the observers watched by it alone
    (`watching`), so that a model that other threads translate with meanwhile is traced
    as it would be alone."""

    def __init__(self, model: Transformer, rec: _Recorder):
        self.model, self.rec = model, rec
        self.handles: list = []
        self.observers: dict[MultiHeadAttention, Observer] = {}
        self.norm = "residual + LayerNorm" if model.cfg.norm == "post" else "LayerNorm before"
        self.length = "S"  # which sequence the (possibly shared) token embedding sees

    def watch(self, module: nn.Module, name: str, axes: str, before: bool = False) -> None:
        """Record the module's output (its first input with `before`)."""
        if before:
            hook = module.register_forward_pre_hook(
                lambda module, inputs: self.add(name, inputs[0], axes)
            )
        else:
            hook = module.register_forward_hook(
                lambda module, inputs, output: self.add(name, output, axes)
            )
        self.handles.append(hook)

    def add(self, name: str, tensor: Tensor, axes: str) -> None:
        """What a hook saw, recorded where the pass is this trace's (`_TRACING`)."""
        if _TRACING.get() is self.rec:
            self.rec.add(name, tensor, axes)

    def entering(self, embed: nn.Module, length: str) -> None:
        def hook(module, inputs):
            if _TRACING.get() is self.rec:
                self.length = length

        self.handles.append(embed.register_forward_pre_hook(hook))

    def lookup(self, tokens: nn.Module) -> None:
        def hook(module, inputs, output):
            self.add(
                "token embedding lookup (before the sqrt(D) scale)", output, _axes(self.length)
            )

        self.handles.append(tokens.register_forward_hook(hook))

    def attention(self, attn: MultiHeadAttention, prefix: str, q_len: str, k_len: str) -> None:
        names = {
            "queries split into heads": f"(B, H, {q_len}, K)",
            "keys split into heads": f"(B, H, {k_len}, K)",
            "values split into heads": f"(B, H, {k_len}, K)",
            "scores QK^T / sqrt(d_k)": f"(B, H, {q_len}, {k_len})",
            "padding mask": f"(B, 1, {q_len}, {k_len})",
            "causal mask": f"({q_len}, {k_len})",
            "attention weights softmax": f"(B, H, {q_len}, {k_len})",
            "weighted values": f"(B, H, {q_len}, K)",
            "heads concatenated": f"(B, {q_len}, D)",
        }
        self.observers[attn] = lambda stage, t: self.rec.add(f"{prefix} / {stage}", t, names[stage])
        self.watch(attn.q_proj, f"{prefix} / Q projection", _axes(q_len))
        self.watch(attn.k_proj, f"{prefix} / K projection", _axes(k_len))
        self.watch(attn.v_proj, f"{prefix} / V projection", _axes(k_len))
        self.watch(attn.out_proj, f"{prefix} / output projection", _axes(q_len))

    def ffn(self, layer: nn.Module, p: str, length: str) -> None:
        self.watch(
            layer.ffn.inner, f"{p} / FFN in (D -> F), before the activation", _axes(length, "F")
        )
        self.watch(layer.ffn.outer, f"{p} / FFN out (F -> D)", _axes(length))
        self.watch(layer.ffn_block.norm, f"{p} / {self.norm} (FFN)", _axes(length))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@contextmanager
def _hooks(model: Transformer, rec: _Recorder) -> Iterator[None]:
    """Hooks on every stage of the model, in data-flow order, that write into `rec`;
    removed on exit."""
    hooks = _Hooks(model, rec)
    norm, watch = hooks.norm, hooks.watch
    hooks.entering(model.src_embed, "S")
    hooks.entering(model.tgt_embed, "T")
    watch(model.src_embed, "source token ids", "(B, S)", before=True)
    hooks.lookup(model.src_embed.tokens)
    watch(model.src_embed, "source embeddings * sqrt(D) + positions, dropout", _axes("S"))
    for i, layer in enumerate(model.encoder_layers):
        p = f"encoder layer {i}"
        hooks.attention(layer.self_attn, f"{p} / self-attention", "S", "S")
        watch(layer.attn_block.norm, f"{p} / {norm} (attention)", _axes("S"))
        hooks.ffn(layer, p, "S")
        watch(layer, f"{p} / output", _axes("S"))
    watch(model.tgt_embed, "target input ids (bos + y)", "(B, T)", before=True)
    if model.tgt_embed.tokens is not model.src_embed.tokens:
        hooks.lookup(model.tgt_embed.tokens)
    watch(model.tgt_embed, "target embeddings * sqrt(D) + positions, dropout", _axes("T"))
    for i, layer in enumerate(model.decoder_layers):
        p = f"decoder layer {i}"
        hooks.attention(layer.self_attn, f"{p} / masked self-attention", "T", "T")
        watch(layer.self_block.norm, f"{p} / {norm} (self-attention)", _axes("T"))
        hooks.attention(layer.cross_attn, f"{p} / cross-attention", "T", "S")
        watch(layer.cross_block.norm, f"{p} / {norm} (cross-attention)", _axes("T"))
        hooks.ffn(layer, p, "T")
    token = _TRACING.set(rec)
    try:
        with watching(hooks.observers):
            yield
    finally:
        _TRACING.reset(token)
        hooks.remove()


@torch.no_grad()
def trace_shapes(
    model: Transformer, batch: Batch, label_smoothing: float = 0.1, values: bool = False
) -> list[Stage]:
    """Every stage of one forward pass and the loss, in data-flow order."""
    model.eval()
    rec = _Recorder(model.cfg, values)
    with _hooks(model, rec):
        memory, src_mask = model.encode(batch.src)
        rec.add("encoder output (memory)", memory, _axes("S"))
        rec.add("source padding mask (True = real token)", src_mask, "(B, S)")
        logits = model.decode(batch.tgt_in, memory, src_mask)
    rec.add("logits (tied output projection D -> V)", logits, "(B, T, V)")
    rec.add("log-probabilities (log-softmax over V)", torch.log_softmax(logits, -1), "(B, T, V)")
    rec.add("target output ids (y + eos)", batch.tgt_out, "(B, T)")
    out = label_smoothed_nll(logits, batch.tgt_out, label_smoothing)
    rec.add(
        f"label-smoothed loss per token (eps {label_smoothing})",
        (out.loss / max(out.tokens, 1)).reshape(()),
        "()",
    )
    return rec.stages


def format_trace(
    stages: list[Stage], cfg: ModelConfig, vocab_size: int, values: bool = False
) -> str:
    """The trace as a text table (and the rounded values, with --values)."""
    head = [
        f"axes: B batch, S source length, T target length, D d_model={cfg.d_model}, "
        f"H heads={cfg.heads}, K head dim={cfg.d_model // cfg.heads},",
        f"      F ffn_dim={cfg.ffn_dim}, V vocab={vocab_size}; cross-attention takes its "
        f"queries from the target and its keys/values from the encoder output",
        "stages are listed in the order the model computes them; the decoder's cross-"
        "attention keys/values are computed once, before its first layer",
    ]
    width = max(len(s.name) for s in stages) + 2
    lines = [*head, "", f"{'stage':<{width}}{'shape':<16}axes"]
    for s in stages:
        lines.append(f"{s.name:<{width}}{str(s.shape):<16}{s.axes}")
        if values and s.values is not None:
            with _print_options():
                text = str(s.values.int() if s.values.dtype == torch.bool else s.values)
            lines.extend("    " + row for row in text.split("\n"))
    return "\n".join(lines)


@contextmanager
def _print_options() -> Iterator[None]:
    torch.set_printoptions(precision=2, threshold=60, edgeitems=2, linewidth=96, sci_mode=False)
    try:
        yield
    finally:
        torch.set_printoptions(profile="default")


# --- parameters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamRow:
    component: str
    count: int
    formula: str  # closed form, e.g. "4(D^2 + D)"
    formula_value: int  # the formula evaluated on the config


def parameter_table(model: Transformer) -> list[ParamRow]:
    """Parameters per component, shared tensors counted once, each with its formula."""
    cfg = model.cfg
    d, f = cfg.d_model, cfg.ffn_dim
    v_src = model.src_embed.tokens.num_embeddings
    v_tgt = model.tgt_embed.tokens.num_embeddings

    def n(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    rows = []
    if model.src_embed.tokens is model.tgt_embed.tokens:
        rows.append(
            ParamRow(
                "shared embeddings = output projection", n(model.tgt_embed.tokens), "V*D", v_tgt * d
            )
        )
    else:
        rows.append(ParamRow("source embeddings", n(model.src_embed.tokens), "V_src*D", v_src * d))
        rows.append(
            ParamRow(
                "target embeddings = output projection",
                n(model.tgt_embed.tokens),
                "V_tgt*D",
                v_tgt * d,
            )
        )
    if cfg.positions == "learned":
        for name, emb in (("source", model.src_embed), ("target", model.tgt_embed)):
            rows.append(
                ParamRow(f"{name} learned positions", n(emb.learned), "P*D", cfg.max_positions * d)
            )
    attention = ("4(D^2 + D)", 4 * (d * d + d))
    ffn = ("2DF + F + D", 2 * d * f + f + d)
    norm = ("2D", 2 * d)
    for i, layer in enumerate(model.encoder_layers):
        p = f"encoder {i}"
        rows.append(ParamRow(f"{p} self-attention Q,K,V,O", n(layer.self_attn), *attention))
        rows.append(ParamRow(f"{p} FFN", n(layer.ffn), *ffn))
        rows.append(
            ParamRow(
                f"{p} LayerNorms (2)", n(layer.attn_block) + n(layer.ffn_block), "2*2D", 2 * norm[1]
            )
        )
    for i, layer in enumerate(model.decoder_layers):
        p = f"decoder {i}"
        rows.append(ParamRow(f"{p} self-attention Q,K,V,O", n(layer.self_attn), *attention))
        rows.append(ParamRow(f"{p} cross-attention Q,K,V,O", n(layer.cross_attn), *attention))
        rows.append(ParamRow(f"{p} FFN", n(layer.ffn), *ffn))
        rows.append(
            ParamRow(
                f"{p} LayerNorms (3)",
                n(layer.self_block) + n(layer.cross_block) + n(layer.ffn_block),
                "3*2D",
                3 * norm[1],
            )
        )
    if cfg.norm == "pre":
        rows.append(
            ParamRow(
                "final LayerNorms (pre-norm)",
                n(model.encoder_norm) + n(model.decoder_norm),
                "2*2D",
                2 * norm[1],
            )
        )
    return rows


def format_parameter_table(model: Transformer) -> str:
    rows = parameter_table(model)
    total = count_parameters(model)
    width = max(len(r.component) for r in rows) + 2
    lines = [
        f"{'component':<{width}}{'parameters':>12}  formula",
        *(f"{r.component:<{width}}{r.count:>12,}  {r.formula} = {r.formula_value:,}" for r in rows),
        f"{'total':<{width}}{sum(r.count for r in rows):>12,}  "
        f"(sum(p.numel() for p in model.parameters()) = {total:,})",
    ]
    return "\n".join(lines)


# --- attention maps -------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionMaps:
    translation: str
    src_tokens: list[str]
    tgt_tokens: list[str]  # the decoder's input: <s> + output pieces
    out_tokens: list[str]  # what each decoder position predicts: output pieces + </s>
    encoder: list[Tensor]  # per layer (H, S, S)
    decoder: list[Tensor]  # per layer (H, T, T)
    cross: list[Tensor]  # per layer (H, T, S)


@torch.no_grad()
def attention_maps(
    model: Transformer,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    text: str,
    max_len_a: float = DEFAULTS.max_len_a,
    max_len_b: int = DEFAULTS.max_len_b,
) -> AttentionMaps:
    """Translate one sentence (greedy), then record every attention of the forward pass
    that scores that translation."""
    model.eval()
    src_ids = src_vocab.encode([text])[0][: model.cfg.max_positions - 1]
    src = torch.tensor([src_ids + [EOS]])  # (1, S)
    options = SearchOptions(max_len_a=max_len_a, max_len_b=max_len_b)
    out_ids = greedy_search(model, src, options)[0]
    batch = collate([(np.array(src_ids), np.array(out_ids))])
    kinds = {
        "encoder": [layer.self_attn for layer in model.encoder_layers],
        "decoder": [layer.self_attn for layer in model.decoder_layers],
        "cross": [layer.cross_attn for layer in model.decoder_layers],
    }
    seen = iter(
        teacher_forced_attention(
            model, batch.src, batch.tgt_in, [attn for attns in kinds.values() for attn in attns]
        )
    )
    weights = {kind: [next(seen)[0] for _ in attns] for kind, attns in kinds.items()}  # (H, q, k)
    src_tokens = [src_vocab.piece(i) for i in src_ids] + ["</s>"]
    tgt_tokens = ["<s>"] + [tgt_vocab.piece(i) for i in out_ids]
    out_tokens = tgt_tokens[1:] + ["</s>"]
    return AttentionMaps(
        tgt_vocab.decode(out_ids),
        src_tokens,
        tgt_tokens,
        out_tokens,
        weights["encoder"],
        weights["decoder"],
        weights["cross"],
    )


def plot_attention(maps: AttentionMaps, out_dir: Path) -> list[Path]:
    """One PNG per attention kind and layer (a panel per head), plus the mean
    cross-attention over layers and heads (a soft alignment). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def draw(
        grids: Tensor,
        rows: list[str],
        cols: list[str],
        title: str,
        path: Path,
        vmax: float | None = 1.0,
    ) -> None:
        heads = grids.size(0)
        size = max(3.0, 0.35 * max(len(rows), len(cols)))
        fig, axes = plt.subplots(
            1, heads, figsize=(max(size * heads, 4.5), size + 0.8), squeeze=False
        )
        for h in range(heads):
            ax = axes[0][h]
            ax.imshow(grids[h].float().numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
            ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
            ax.set_yticks(range(len(rows)), rows, fontsize=7)
            if heads > 1:
                ax.set_title(f"head {h}", fontsize=8)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        with atomic_file(path) as f:  # an interrupted run leaves no half-drawn picture
            fig.savefig(f, dpi=100, format="png")
        plt.close(fig)
        written.append(path)

    kinds = (
        ("encoder", maps.encoder, maps.src_tokens, maps.src_tokens, "encoder self-attention"),
        (
            "decoder",
            maps.decoder,
            maps.out_tokens,
            maps.tgt_tokens,
            "decoder self-attention (causal; rows: the token being predicted)",
        ),
        (
            "cross",
            maps.cross,
            maps.out_tokens,
            maps.src_tokens,
            "cross-attention (rows: the token being predicted)",
        ),
    )
    for kind, layers, rows, cols, title in kinds:
        for i, grid in enumerate(layers):
            draw(grid, rows, cols, f"{title}, layer {i}", out_dir / f"{kind}_layer{i}.png")
    mean = torch.stack(maps.cross).mean(dim=(0, 1))[None]  # (1, T, S)
    draw(
        mean,
        maps.out_tokens,
        maps.src_tokens,
        "mean cross-attention (soft alignment)",
        out_dir / "alignment.png",
        vmax=None,
    )
    return written

"""Word alignments from cross-attention, in Pharaoh format ("0-0 1-2 ...").

Once a translation is found, one teacher-forced pass over (source, output)
(`teacher_forced_attention`, which `mtkit explain` uses too) records the
cross-attention of one decoder layer, averaged over its heads (and over the models of
an ensemble). Each output subword is linked to the source subword it attends to most
(never the source's eos, nor a bare "▁" piece); subword links become word links, where
a word starts at each SentencePiece piece that begins with "▁". A link is (source
word, target word).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.core.errors import OptionError, plural
from mtkit.data.batching import collate
from mtkit.model.attention import MultiHeadAttention
from mtkit.model.transformer import Transformer, alignment_layer

WORD_START = "\u2581"  # SentencePiece's whitespace marker


def default_layer(model: Transformer) -> int:
    """The layer links come from where none is asked for (`alignment_layer`)."""
    return alignment_layer(model)


def check_layer(layer: int, models: Sequence[Transformer], option: str = "--align-layer") -> None:
    fewest = min(m.cfg.decoder_layers for m in models)
    if not 0 <= layer < fewest:
        span = "0" if fewest == 1 else f"between 0 and {fewest - 1}"
        raise OptionError(
            f"{option} must be {span} (the model has "
            f"{plural(fewest, 'decoder layer')}), got {layer}"
        )


@torch.no_grad()
def teacher_forced_attention(
    model: Transformer,
    src: Tensor,
    tgt_in: Tensor,
    watched: Sequence[MultiHeadAttention],
    decoder_layers: int | None = None,
) -> list[Tensor]:
    """One teacher-forced pass over src (B, S) and tgt_in (B, T), and the attention
    weights of each `watched` attention of the model, in the order given: (B, H, S, S)
    for an encoder self-attention, (B, H, T, T) for a decoder self-attention, (B, H, T, S)
    for a cross-attention; row t of the decoder's is the attention while predicting the
    token after tgt_in[:, t]. Only the first `decoder_layers` decoder layers run (None:
    all of them); the output projection never does."""
    weights: dict[int, Tensor] = {}
    for i, attn in enumerate(watched):

        def record(stage: str, t: Tensor, i: int = i) -> None:
            if stage == "attention weights softmax":
                weights[i] = t  # (B, H, q, k)

        attn.observer = record
    try:
        memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
        y = model.tgt_embed(tgt_in)  # (B, T, D)
        for block in model.decoder_layers[:decoder_layers]:
            y, _ = block(y, block.cross_attn.project_kv(memory), src_mask[:, None, None, :])
    finally:
        for attn in watched:
            attn.observer = None
    return [weights[i] for i in range(len(watched))]


def cross_attention(
    model: Transformer, src: Tensor, tgt_in: Tensor, layer: int, head: int | None = None
) -> Tensor:
    """Teacher-forced cross-attention weights of decoder `layer`, mean over heads (or of
    one `head`): src (B, S), tgt_in (B, T) -> (B, T, S); row t is the attention while
    predicting the token after tgt_in[:, t]. The layers above `layer` and the output
    projection are not run."""
    attn = model.decoder_layers[layer].cross_attn
    weights = teacher_forced_attention(model, src, tgt_in, [attn], layer + 1)[0]
    if head is not None:
        return weights[:, head].float()  # (B, H, T, S) -> (B, T, S)
    return weights.float().mean(dim=1)  # (B, H, T, S) -> (B, T, S)


def word_index(pieces: Sequence[str]) -> list[int]:
    """The word each subword belongs to: a new word starts at each piece that begins
    with "▁" (and at the first piece)."""
    words, current = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or current < 0:
            current += 1
        words.append(current)
    return words


def word_links(
    attention: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> tuple[tuple[int, int], ...]:
    """attention (T, S) over the output subwords x the source subwords (eos excluded)
    -> sorted unique (source word, target word) links. A bare "▁" piece (a space on its
    own, as small vocabularies make) carries no meaning: it neither links nor is linked
    to, unless the source has nothing else."""
    if not len(src_pieces) or not len(tgt_pieces):
        return ()
    src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
    meaningful = torch.tensor([p != WORD_START for p in src_pieces])  # (S,)
    if not meaningful.any():
        meaningful[:] = True
    scores = attention[: len(tgt_pieces), : len(src_pieces)]  # (T, S)
    best = scores.masked_fill(~meaningful, -1.0).argmax(dim=-1).tolist()  # (T,)
    return tuple(
        sorted(
            {
                (src_words[s], tgt_words[t])
                for t, s in enumerate(best)
                if tgt_pieces[t] != WORD_START
            }
        )
    )


@torch.no_grad()
def align(
    models: Sequence[Transformer],
    sources: list[list[int]],
    outputs: list[list[int]],
    src_pieces: list[list[str]],
    tgt_pieces: list[list[str]],
    layer: int | None,
    device: torch.device,
    guided: bool = False,
) -> list[tuple[tuple[int, int], ...]]:
    """Word links for each (source ids, output ids) pair, from the cross-attention of
    `layer` (None: each model's `default_layer`), averaged over the models. A model
    trained with guided alignment (`guided`) links through the head that learned the
    alignments (head 0 of its `default_layer`), unless another layer is asked for."""
    if not sources:
        return []
    batch = collate(list(zip(sources, outputs, strict=True))).to(device)  # (src + eos, bos + out)
    attention = (
        torch.stack(
            [
                cross_attention(
                    m,
                    batch.src,
                    batch.tgt_in,
                    default_layer(m) if layer is None else layer,
                    0 if guided and layer is None else None,
                )
                for m in models
            ]
        )
        .mean(dim=0)
        .cpu()
    )  # (B, T, S)
    return [
        word_links(attention[i], sp, tp)
        for i, (sp, tp) in enumerate(zip(src_pieces, tgt_pieces, strict=True))
    ]

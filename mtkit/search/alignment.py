"""Word alignments from cross-attention, in Pharaoh format ("0-0 1-2 ...").

Once a translation is found, one teacher-forced pass over (source, output)
(`teacher_forced_attention`, which `mtkit explain` uses too) records the
cross-attention of one decoder layer, averaged over its heads (and over the models of
an ensemble). The weights are read both ways, as an aligner's two directions: each
output subword's most attended source subword and each source subword's most attending
output subword (never the source's eos, nor a bare "▁" piece), as word links (a word
starts at each SentencePiece piece that begins with "▁"), symmetrized with grow-diag
(`word_links`). A link is (source word, target word).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.core.errors import OptionError, plural
from mtkit.data.alignments import grow_diag
from mtkit.data.batching import collate
from mtkit.model.attention import MultiHeadAttention, Observer, watching
from mtkit.model.transformer import Transformer, alignment_layer

WORD_START = "\u2581"  # SentencePiece's whitespace marker


def default_layer(model: Transformer, guided: bool = False) -> int:
    """The layer links come from where none is asked for: a model trained with guided
    alignment's trained layer (`alignment_layer`), otherwise the last. On the main job's
    model (three decoder layers, unguided) the last layer's links, read both ways, place
    more of a document's tags where eflomal's links put them than the second-to-last's,
    and err less against eflomal (docs/performance.md); Garg et al. (2019) found the
    second-to-last better on their six-layer model, and on the copy task it is the exact
    one: `--align-layer` chooses."""
    return alignment_layer(model) if guided else model.cfg.decoder_layers - 1


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
    encoded: tuple[Tensor, Tensor] | None = None,
) -> list[Tensor]:
    """One teacher-forced pass over src (B, S) and tgt_in (B, T), and the attention
    weights of each `watched` attention of the model, in the order given: (B, H, S, S)
    for an encoder self-attention, (B, H, T, T) for a decoder self-attention, (B, H, T, S)
    for a cross-attention; row t of the decoder's is the attention while predicting the
    token after tgt_in[:, t]. Only the first `decoder_layers` decoder layers run (None:
    all of them); the output projection never does. `encoded`: src's memory and mask as
    the search that found the outputs made them (then the encoder does not run again;
    none of its attentions can be watched)."""
    weights: dict[int, Tensor] = {}

    def recorder(i: int) -> Observer:
        def record(stage: str, t: Tensor) -> None:
            if stage == "attention weights softmax":
                weights[i] = t  # (B, H, q, k)

        return record

    # watched by this pass alone: a model shared by threads is watched by each of them
    # for itself (`watching`), never through state of the model
    with watching({attn: recorder(i) for i, attn in enumerate(watched)}):
        memory, src_mask = encoded or model.encode(src)  # (B, S, D), (B, S)
        y = model.tgt_embed(tgt_in)  # (B, T, D)
        for block in model.decoder_layers[:decoder_layers]:
            y, _ = block(y, block.cross_attn.project_kv(memory), src_mask[:, None, None, :])
    return [weights[i] for i in range(len(watched))]


def cross_attention(
    model: Transformer,
    src: Tensor,
    tgt_in: Tensor,
    layer: int,
    head: int | None = None,
    encoded: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Teacher-forced cross-attention weights of decoder `layer`, mean over heads (or of
    one `head`): src (B, S), tgt_in (B, T) -> (B, T, S); row t is the attention while
    predicting the token after tgt_in[:, t]. The layers above `layer` and the output
    projection are not run; nor is the encoder, where src comes `encoded`."""
    attn = model.decoder_layers[layer].cross_attn
    weights = teacher_forced_attention(model, src, tgt_in, [attn], layer + 1, encoded)[0]
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
    -> sorted unique (source word, target word) links, read in both directions: each
    output subword's most attended source subword, and each source subword's most
    attending output subword, symmetrized as an aligner's two directions are (grow-diag:
    the links both agree on, grown to neighbouring links of either): a word neither
    direction agrees on stays unlinked, as an aligner leaves it. A bare "▁" piece (a
    space on its own, as small vocabularies make) carries no meaning: it neither links
    nor is linked to, unless its side has nothing else.

    Against eflomal's links of test2016 (source, reference), reading both directions
    lowered the alignment error rate from 0.587 to 0.498 on the main job's model, and
    from 0.241 to 0.218 on its guided twin (`benchmarks/alignment_quality.py`), and put
    more of a document's tags on the right words (docs/performance.md)."""
    if not len(src_pieces) or not len(tgt_pieces):
        return ()
    src_words, tgt_words = word_index(src_pieces), word_index(tgt_pieces)
    src_meaningful = _meaningful(src_pieces)  # (S,)
    tgt_meaningful = _meaningful(tgt_pieces)  # (T,)
    scores = attention[: len(tgt_pieces), : len(src_pieces)]  # (T, S)
    to_source = scores.masked_fill(~src_meaningful, -1.0).argmax(dim=-1).tolist()  # (T,)
    to_target = scores.masked_fill(~tgt_meaningful[:, None], -1.0).argmax(dim=0).tolist()  # (S,)
    forward = {(src_words[s], tgt_words[t]) for t, s in enumerate(to_source) if tgt_meaningful[t]}
    backward = {(src_words[s], tgt_words[t]) for s, t in enumerate(to_target) if src_meaningful[s]}
    return tuple(sorted(grow_diag(forward, backward)))


def _meaningful(pieces: Sequence[str]) -> Tensor:
    """Which pieces may link: all but a bare "▁", unless there is nothing else."""
    meaningful = torch.tensor([p != WORD_START for p in pieces])
    if not meaningful.any():
        meaningful[:] = True
    return meaningful


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
    encoded: tuple[Tensor, Tensor] | None = None,
) -> list[tuple[tuple[int, int], ...]]:
    """Word links for each (source ids, output ids) pair, from the cross-attention of
    `layer` (None: each model's `default_layer`), averaged over the models. A model
    trained with guided alignment (`guided`) links through the head that learned the
    alignments (head 0 of `alignment_layer`), unless another layer is asked for.
    `encoded`: one model's memory and mask of the sources, as its search made them
    (taken where their shape is the batch's)."""
    if not sources:
        return []
    batch = collate(list(zip(sources, outputs, strict=True))).to(device)  # (src + eos, bos + out)
    if encoded is not None and (len(models) > 1 or encoded[1].shape != batch.src.shape):
        encoded = None
    attention = (
        torch.stack(
            [
                cross_attention(
                    m,
                    batch.src,
                    batch.tgt_in,
                    default_layer(m, guided) if layer is None else layer,
                    0 if guided and layer is None else None,
                    encoded,
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

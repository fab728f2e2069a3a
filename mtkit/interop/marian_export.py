"""`mtkit export --to huggingface`: a checkpoint as a Marian model in the Hugging Face
layout, which `transformers.MarianMTModel` and `MarianTokenizer` load with
`from_pretrained` and run as mtkit does (the same translations, greedy and beam):

    DIR/config.json              MarianConfig: the architecture and the special ids
    DIR/generation_config.json   start, eos and pad ids, pad never generated, the beam
    DIR/model.safetensors        the weights: Marian's names, Marian's row order, float32
    DIR/source.spm, target.spm   the SentencePiece models (segmentation only)
    DIR/vocab.json               piece -> id (both sides when the embeddings are shared)
    DIR/target_vocab.json        the target's, for separate vocabularies
    DIR/tokenizer_config.json    the languages, separate_vocabs, the special pieces
    DIR/mtkit.json               the marker: format mtkit-hf-1, the checkpoint, every
                                 file's size and SHA-256 (`mtkit.interop.export_folder`); only a
                                 folder it marks is replaced by `--force`

Writing the folder needs safetensors (`pip install 'mtkit[hf]'`), never transformers.

What MarianMTModel expresses: post-norm layers, ReLU, GELU or swish, the output tied to
the target embedding (plus `final_logits_bias`: mtkit's `output_bias`, zeros without
one), and Marian's fixed sinusoids (sines, then cosines: `positions: sinusoidal_split`).
So imported models (`mtkit import`) and their fine-tuned descendants export; a native
mtkit model trained with the paper's interleaved sinusoids or learned positions, or
pre-norm, is refused in one line naming the field, since MarianMTModel has no place for
its positions or its final norms. A native model trained with `sinusoidal_split` exports.

Ids: the import's permutation (`mtkit.interop.marian_import`) inverted. Marian id m is mtkit id
`rows[m]`: eos (3) becomes 0, unk (1) 1, the ordinary pieces keep their order from 2,
and bos (2), which is Marian's `<pad>` and decoder start, becomes the last id, as
OPUS-MT has it. mtkit's pad row (0) has no Marian id: an imported model gives it no
probability (its output bias is `NEVER`), so the softmax is Marian's. A vocabulary with
an id table (`Vocab.pieces`) gives vocab.json directly; one without (a native model's,
whose ids are SentencePiece's) gives its SentencePiece pieces in id order, moved the
same way. A native model's pad row is not given zero probability by its weights, so
leaving it out changes beam search's scores slightly (greedy output is the same).
`import_marian` of an export gives back the checkpoint's weights bit for bit (the pad
row of the embedding comes back zero, as an import makes it) and its id tables.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

import torch

from mtkit.core.atomic import atomic_dir
from mtkit.core.config import Config, ModelConfig
from mtkit.core.vocab import BOS, EOS, UNK, Vocab
from mtkit.engines.ct2 import MANIFEST, ExportError
from mtkit.engines.pytorch_loading import load_model
from mtkit.interop.export_folder import HF_FORMAT, export_target, manifest_files
from mtkit.model.transformer import Transformer

log = logging.getLogger(__name__)

PAD_PIECE = "<pad>"  # Marian's pad and decoder start: mtkit's bos row
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}  # mtkit's -> Marian's
POSITIONS = {"sinusoidal": "interleaves its sines and cosines", "learned": "learns its positions"}
# mtkit's module in a layer -> Marian's (`mtkit.interop.marian_import.state_dict`, inverted)
LAYER_NAMES = {
    "self_attn": "self_attn",
    "cross_attn": "encoder_attn",
    "ffn.inner": "fc1",
    "ffn.outer": "fc2",
    "attn_block.norm": "self_attn_layer_norm",
    "self_block.norm": "self_attn_layer_norm",
    "cross_block.norm": "encoder_attn_layer_norm",
    "ffn_block.norm": "final_layer_norm",
}


class HFExportError(ExportError):
    """A checkpoint MarianMTModel cannot express, or a missing extra (one line)."""


def safetensors_writer():
    """`safetensors.torch.save_file`, or one line saying which extra to install."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise HFExportError(
            "a Hugging Face export needs safetensors: pip install 'mtkit[hf]'"
        ) from None
    return save_file


def check_expressible(cfg: ModelConfig) -> None:
    """One line naming the field where MarianMTModel cannot express the architecture."""
    if cfg.norm != "post":
        raise HFExportError(
            f"model.norm={cfg.norm}: MarianMTModel is post-norm (a LayerNorm "
            f"after each residual, none at the end of a stack); a pre-norm "
            f"model cannot be exported to it"
        )
    if cfg.positions != "sinusoidal_split":
        raise HFExportError(
            f"model.positions={cfg.positions}: MarianMTModel adds fixed "
            f"sinusoids in Marian's layout (sines, then cosines) and this "
            f"model {POSITIONS.get(cfg.positions, 'has others')}; only a "
            f"model with positions sinusoidal_split (an imported one, or "
            f"one trained so) exports to it"
        )
    if cfg.activation not in ACTIVATIONS:
        raise HFExportError(
            f"model.activation={cfg.activation}: MarianMTModel has {', '.join(ACTIVATIONS)} here"
        )


def marian_table(vocab: Vocab, side: str) -> tuple[dict[str, int], list[int]]:
    """One side's vocab.json (piece -> Marian id) and its rows: `rows[m]` is the mtkit id
    of Marian id m. `</s>` 0, `<unk>` 1, the ordinary pieces in order, `<pad>` (mtkit's
    bos) last; mtkit's pad has none. Without an id table, SentencePiece's pieces."""
    rows = [EOS, UNK, *range(EOS + 1, len(vocab)), BOS]  # (V - 1,)
    pieces = [vocab.piece(i) for i in rows[:-1]] + [PAD_PIECE]
    table = {p: m for m, p in enumerate(pieces)}
    if len(table) != len(pieces):
        twice = next(p for p, n in Counter(pieces).items() if n > 1)
        raise HFExportError(
            f"the {side} vocabulary has the piece {twice!r} more than once "
            f"(mtkit's bos becomes Marian's {PAD_PIECE}); vocab.json needs "
            f"each piece once"
        )
    return table, rows


def marian_name(key: str) -> str:
    """Marian's name of an mtkit layer weight: `encoder_layers.0.ffn.inner.weight` ->
    `model.encoder.layers.0.fc1.weight`."""
    stack, _, rest = key.partition("_layers.")
    index, _, rest = rest.partition(".")
    if stack in ("encoder", "decoder") and index.isdigit():
        for ours, theirs in LAYER_NAMES.items():
            if rest.startswith(ours + "."):
                return f"model.{stack}.layers.{index}.{theirs}{rest[len(ours) :]}"
    raise HFExportError(f"the model has {key}, which MarianMTModel has no place for")


def marian_weights(
    model: Transformer, src_rows: list[int], tgt_rows: list[int], src_size: int
) -> dict[str, torch.Tensor]:
    """The MarianMTModel state dict of an mtkit model: Marian's names, its rows in
    Marian's order (`marian_table`); a separate source embedding is filled up with zero
    rows to `src_size` (MarianMTModel's encoder takes the target's pad id)."""
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    tgt = ours.pop("tgt_embed.tokens.weight")[torch.tensor(tgt_rows)]  # (Vt - 1, D)
    src = ours.pop("src_embed.tokens.weight")
    bias = ours.pop("output_bias", None)
    bias = torch.zeros(len(tgt_rows)) if bias is None else bias[torch.tensor(tgt_rows)]
    out = {"final_logits_bias": bias[None]}  # (1, Vt - 1)
    if model.cfg.share_embeddings:
        out["model.shared.weight"] = tgt
    else:
        src = src[torch.tensor(src_rows)]  # (Vs - 1, D)
        fill = src.new_zeros(src_size - len(src_rows), src.size(1))  # (src_size - Vs + 1, D)
        out["model.encoder.embed_tokens.weight"] = torch.cat([src, fill])  # (src_size, D)
        out["model.decoder.embed_tokens.weight"] = tgt
    for key, value in ours.items():
        out[marian_name(key)] = value.contiguous()
    return out


def marian_config(cfg: ModelConfig, src_size: int, tgt_size: int) -> dict:
    """config.json: the MarianConfig of `cfg`, its pad (and start) the target's last id."""
    pad = tgt_size - 1
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": src_size,
        "decoder_vocab_size": tgt_size,
        "share_encoder_decoder_embeddings": cfg.share_embeddings,
        "tie_word_embeddings": True,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads,
        "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.ffn_dim,
        "decoder_ffn_dim": cfg.ffn_dim,
        "activation_function": ACTIVATIONS[cfg.activation],
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "pad_token_id": pad,
        "decoder_start_token_id": pad,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "bos_token_id": None,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dtype": "float32",
    }


def generation_config(cfg: Config, tgt_size: int) -> dict:
    """generation_config.json: the special ids, pad (mtkit's bos) never generated, the
    checkpoint's beam, at most the positions. mtkit's length penalty is GNMT's, which
    `generate`'s is not: it is left at transformers' default."""
    pad = tgt_size - 1
    return {
        "decoder_start_token_id": pad,
        "pad_token_id": pad,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "bad_words_ids": [[pad]],
        "num_beams": cfg.decode.beam,
        "max_length": cfg.model.max_positions,
    }


def tokenizer_config(cfg: Config, src_table: dict[str, int], shared: bool) -> dict:
    """tokenizer_config.json: MarianTokenizer's languages, vocabularies and specials."""
    pieces = {m: p for p, m in src_table.items()}
    return {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": cfg.data.src_lang,
        "target_lang": cfg.data.tgt_lang,
        "separate_vocabs": not shared,
        "eos_token": pieces[0],
        "unk_token": pieces[1],
        "pad_token": PAD_PIECE,
        "model_max_length": cfg.model.max_positions,
    }


def export_huggingface(
    checkpoint: str | os.PathLike, output: str | os.PathLike, force: bool = False
) -> Path:
    """Write the Hugging Face Marian folder of `checkpoint` to `output` (atomically);
    `force` replaces a previous mtkit export there (`export_target`)."""
    save_file = safetensors_writer()
    target = export_target(output, checkpoint, force)
    model, src_vocab, tgt_vocab, cfg, weights, _ = load_model(checkpoint)
    check_expressible(cfg.model)
    shared = cfg.model.share_embeddings
    src_table, src_rows = marian_table(src_vocab, "source")
    tgt_table, tgt_rows = marian_table(tgt_vocab, "target")
    if shared and src_table != tgt_table:
        raise HFExportError(
            "model.share_embeddings=true but the source and target "
            "vocabularies differ; MarianMTModel's shared embedding takes "
            "one vocab.json for both sides"
        )
    src_size = max(len(src_table), len(tgt_table)) if not shared else len(tgt_table)
    tensors = marian_weights(model, src_rows, tgt_rows, src_size)
    files = {
        "config.json": marian_config(cfg.model, src_size, len(tgt_table)),
        "generation_config.json": generation_config(cfg, len(tgt_table)),
        "tokenizer_config.json": tokenizer_config(cfg, src_table, shared),
        "vocab.json": src_table,
    }
    if not shared:
        files["target_vocab.json"] = tgt_table
    with atomic_dir(target) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "source.spm").write_bytes(src_vocab.model_proto)
        (tmp / "target.spm").write_bytes(tgt_vocab.model_proto)
        for name, data in files.items():
            (tmp / name).write_text(
                json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        manifest = {
            "format": HF_FORMAT,
            "checkpoint": str(checkpoint),
            "step": weights.step,
            "weights": weights.about,
            "files": manifest_files(tmp),
        }
        # inside the temporary folder that `atomic_dir` renames only once complete
        marker = json.dumps(manifest, indent=1) + "\n"
        (tmp / MANIFEST).write_text(marker, encoding="utf-8")  # written in place on purpose
    log.info(
        "exported %s (%s) to %s as a Hugging Face Marian model", checkpoint, weights.about, output
    )
    return Path(output)

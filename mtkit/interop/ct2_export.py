"""`mtkit export --to ctranslate2`: a checkpoint as a self-contained CTranslate2 folder
(the layout: `mtkit.engines.ct2`), optionally quantized.

Every variant mtkit trains maps onto CTranslate2's `TransformerSpec`: post- or pre-norm,
sinusoidal or learned positions (the exact table is stored: mtkit's sinusoids interleave
sin and cos, which CTranslate2's built-in table does not), ReLU or GELU, shared or
separate embeddings. The output projection is tied to the target embedding, without bias.
The folder is written beside its final place and renamed when complete. `--force`
replaces only a previous export, which its `mtkit.json` marks (`mtkit.interop.export_folder`):
never a folder that holds anything else (a checkpoint, a run directory, the current
folder, a model mtkit did not write).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtkit.core.atomic import atomic_dir
from mtkit.core.config import config_to_dict
from mtkit.engines.ct2 import FORMAT, MANIFEST, ExportError, ctranslate2_module
from mtkit.interop.export_folder import export_target, manifest_files

if TYPE_CHECKING:
    from mtkit.model.transformer import Transformer

QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "bfloat16",
    "float16",
)


def check_quantization(quantization: str, device: str = "cpu") -> None:
    """One line when this machine cannot run `quantization` on `device`."""
    ct2 = ctranslate2_module()
    if quantization not in QUANTIZATIONS:
        raise ExportError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    supported = ct2.get_supported_compute_types(device)
    if quantization not in supported:
        raise ExportError(
            f"--quantization {quantization} is not supported on this "
            f"{device.upper()} (supported: {', '.join(sorted(supported))})"
        )


def export_ctranslate2(
    checkpoint: str | os.PathLike,
    output: str | os.PathLike,
    quantization: str = "float32",
    force: bool = False,
) -> Path:
    """Write the CTranslate2 folder of `checkpoint` to `output` (atomically); `force`
    replaces a previous export there (`export_target`)."""
    from mtkit.engines.pytorch_loading import load_model

    ct2 = ctranslate2_module()
    check_quantization(quantization)
    target = export_target(output, checkpoint, force)
    model, src_vocab, tgt_vocab, cfg, weights, shortlist = load_model(checkpoint)
    spec = model_spec(
        model,
        [src_vocab.piece(i) for i in range(len(src_vocab))],
        [tgt_vocab.piece(i) for i in range(len(tgt_vocab))],
    )

    class Converter(ct2.converters.Converter):
        def _load(self):
            return spec

    with atomic_dir(target) as tmp:
        folder = tmp / "model"  # the converter makes its own folder
        Converter().convert(str(folder), quantization=quantization)
        for item in folder.iterdir():
            item.rename(tmp / item.name)
        folder.rmdir()
        (tmp / "source.spm").write_bytes(src_vocab.model_proto)
        (tmp / "target.spm").write_bytes(tgt_vocab.model_proto)
        if shortlist is not None:  # CTranslate2's vocabulary map: `use_vmap`
            vmap = vocabulary_map(shortlist, src_vocab, tgt_vocab)
            # inside tmp, which atomic_dir renames into place only once complete:
            (tmp / VMAP).write_text(vmap, "utf-8")  # written in place on purpose
        files = manifest_files(tmp)
        manifest = json.dumps(
            {
                "format": FORMAT,
                "checkpoint": str(checkpoint),
                "step": weights.step,
                "weights": weights.about,
                "quantization": quantization,
                "files": files,
                "config": config_to_dict(cfg),
                **_tables(src_vocab, tgt_vocab),
            },
            indent=1,
            default=str,
        )
        # All of tmp is renamed into place at the end, so a partial file is never seen:
        (tmp / MANIFEST).write_text(manifest + "\n")  # written in place on purpose
    return output


VMAP = "vmap.txt"  # the file CTranslate2 reads a vocabulary map from


def vocabulary_map(shortlist, src_vocab, tgt_vocab) -> str:
    """A lexical shortlist (`mtkit.search.shortlist`) as CTranslate2's vocabulary map: a
    line "source piece<TAB>target pieces" per source piece, and the pieces every batch
    may output after an empty source piece. CTranslate2 adds unk, bos and eos itself."""
    tgt = tgt_vocab.piece
    lines = ["\t" + " ".join(tgt(i) for i in shortlist.frequent.tolist())]
    for source, row in enumerate(shortlist.table.tolist()):
        targets = [tgt(i) for i in row if i >= 0]
        if targets and source < len(src_vocab):
            lines.append(f"{src_vocab.piece(source)}\t{' '.join(targets)}")
    return "".join(line + "\n" for line in lines)


def _tables(src_vocab, tgt_vocab) -> dict:
    """The id tables of vocabularies whose ids are not SentencePiece's (an imported
    model's) and a multilingual model's target `languages` (`Vocab`), for the manifest:
    the runtime reads them back (`engines.ct2`)."""
    tables = {
        f"{side}_pieces": v.pieces
        for side, v in (("src", src_vocab), ("tgt", tgt_vocab))
        if v.pieces is not None
    }
    return {**tables, "tgt_languages": tgt_vocab.languages} if tgt_vocab.languages else tables


def model_spec(model: Transformer, src_pieces: list[str], tgt_pieces: list[str]):
    """The CTranslate2 `TransformerSpec` of an mtkit model, weights set."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    activation = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
    }[cfg.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.heads,
        pre_norm=cfg.norm == "pre",
        activation=activation,
    )
    spec.config.layer_norm_epsilon = model.encoder_layers[0].attn_block.norm.eps
    spec.config.add_source_eos = True  # mtkit's sources end with eos
    spec.config.decoder_start_token = "<s>"
    weights = _Weights({k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()})
    _set_inputs(spec.encoder, model.src_embed)
    for i, layer in enumerate(spec.encoder.layer):
        weights.self_attention_and_ffn(layer, f"encoder_layers.{i}", "attn_block")
    _set_inputs(spec.decoder, model.tgt_embed)
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder_layers.{i}"
        weights.self_attention_and_ffn(layer, p, "self_block")
        weights.linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
        weights.linear(
            layer.attention.linear[1], f"{p}.cross_attn.k_proj", f"{p}.cross_attn.v_proj"
        )
        weights.linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
        weights.norm(layer.attention.layer_norm, f"{p}.cross_block.norm")
    if cfg.norm == "pre":
        weights.norm(spec.encoder.layer_norm, "encoder_norm")
        weights.norm(spec.decoder.layer_norm, "decoder_norm")
    spec.decoder.projection.weight = model.output_weight.detach().float().numpy()
    if model.output_bias is not None:
        spec.decoder.projection.bias = model.output_bias.detach().float().numpy()
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    return spec


def _set_inputs(target, embed) -> None:
    """A stack's token embedding and its position table (mtkit's own, stored whole)."""
    tokens = (
        target.embeddings[0] if isinstance(target.embeddings, list) else target.embeddings
    )  # the encoder has a list (source features)
    tokens.weight = embed.tokens.weight.detach().float().numpy()
    table = embed.learned.weight if embed.learned is not None else embed.sinusoidal
    target.position_encodings.encodings = table.detach().float().numpy()
    target.scale_embeddings = True  # tokens * sqrt(d_model), then + positions


class _Weights:
    """An mtkit state dict (as numpy arrays), set into CTranslate2's layer specs."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def linear(self, target, *names: str, bias: bool = True) -> None:
        """Set a (possibly fused) linear layer from mtkit's `names` (concatenated)."""
        target.weight = np.concatenate([self.arrays[f"{n}.weight"] for n in names])
        if bias:
            target.bias = np.concatenate([self.arrays[f"{n}.bias"] for n in names])

    def norm(self, target, name: str) -> None:
        target.gamma, target.beta = self.arrays[f"{name}.weight"], self.arrays[f"{name}.bias"]

    def self_attention_and_ffn(self, layer, p: str, attn_block: str) -> None:
        self.linear(layer.self_attention.linear[0], *(f"{p}.self_attn.{x}_proj" for x in "qkv"))
        self.linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        self.norm(layer.self_attention.layer_norm, f"{p}.{attn_block}.norm")
        self.linear(layer.ffn.linear_0, f"{p}.ffn.inner")
        self.linear(layer.ffn.linear_1, f"{p}.ffn.outer")
        self.norm(layer.ffn.layer_norm, f"{p}.ffn_block.norm")

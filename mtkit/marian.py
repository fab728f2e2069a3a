"""`mtkit import`: a Marian (OPUS-MT) model in the Hugging Face layout as an mtkit checkpoint.

    FOLDER/config.json                      MarianConfig: the architecture
    FOLDER/model.safetensors                the weights (or pytorch_model.bin, read with
                                            torch.load(weights_only=True): no code runs)
    FOLDER/source.spm, target.spm           the SentencePiece models (segmentation only)
    FOLDER/vocab.json                       piece -> id, shared by both sides (and
    FOLDER/target_vocab.json                the target's, for separate vocabularies)

What Marian has and mtkit's own models lack becomes model options (`ModelConfig`):
`activation: swish`, `positions: sinusoidal_split` (sines, then cosines), `output_bias`
(the final logits bias), and each side's id table (`Vocab(pieces=...)`: ids come from
vocab.json, SentencePiece only segments). An architecture mtkit cannot represent exactly
is refused in one line naming the field and its value.

Ids. mtkit's special ids are fixed (pad 0, unk 1, bos 2, eos 3) and every layer relies on
them, so the rows are permuted into them rather than the ids made configurable: Marian's
`</s>` becomes 3, `<unk>` 1, and `<pad>`, which Marian also starts the decoder with,
becomes bos (2); the other pieces keep their order from id 4. mtkit's pad (0) is a new,
all-zero row whose output bias is `NEVER`: its probability underflows to exactly 0, so the
softmax is Marian's over its own rows, and translations are Marian's (tests compare them
with `transformers`' `generate`). A finite bias keeps a fine-tuning loss finite.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mtkit.checkpoint import save_checkpoint
from mtkit.config import Config, DataConfig, ModelConfig, config_to_dict
from mtkit.errors import UserError
from mtkit.model import build_model
from mtkit.vocab import BOS, EOS, PAD, UNK, Vocab, vocab_entry

log = logging.getLogger(__name__)

NEVER = -1e4  # the new pad row's output bias: exp(NEVER - logits) is 0 in fp32 and bf16
FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}


class MarianImportError(UserError, ValueError):
    """A folder or hub name that is not a Marian model mtkit can represent (one line)."""


@dataclass(frozen=True)
class Marian:
    """What the import reads: the architecture, both sides' id tables (mtkit order:
    `order[i]` is the Marian id of mtkit id i, -1 for the new pad row), the
    SentencePiece models and the weights."""

    model: ModelConfig
    src_pieces: list[str]
    tgt_pieces: list[str]
    src_order: list[int]
    tgt_order: list[int]
    src_spm: bytes
    tgt_spm: bytes
    weights: dict[str, torch.Tensor]


def locate(source: str | os.PathLike) -> Path:
    """A local folder, or a Hub name (`Helsinki-NLP/opus-mt-en-de`) fetched into the
    Hugging Face cache (offline: only what the cache holds)."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or str(source).count("/") != 1:
        raise MarianImportError(f"{source}: not a model folder (a Marian model in the Hugging "
                                f"Face layout) nor a Hub name such as Helsinki-NLP/opus-mt-en-de")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MarianImportError("a Hub name needs huggingface_hub: pip install 'mtkit[hf]'"
                                ) from None
    patterns = [*FILES, "target_vocab.json", "model.safetensors", "pytorch_model.bin",
                "tokenizer_config.json"]
    try:
        return Path(snapshot_download(str(source), allow_patterns=patterns))
    except Exception as e:  # offline and not cached, unknown name, network error
        raise MarianImportError(f"{source}: cannot fetch it from the Hugging Face Hub and it "
                                f"is not in the local cache ({type(e).__name__})") from None


def read_marian(folder: Path) -> Marian:
    """Everything the import needs from a model folder, each file checked."""
    for name in FILES:
        if not (folder / name).is_file():
            raise MarianImportError(f"{folder}: no {name}; a Marian model folder holds "
                                    f"{', '.join(FILES)} and its weights")
    config = _json(folder / "config.json")
    model, ids = model_config(config, folder / "config.json")
    src_vocab = _json(folder / "vocab.json")
    shared = config.get("share_encoder_decoder_embeddings", True)
    tgt_file = folder / "target_vocab.json"
    tgt_vocab = src_vocab if shared or not tgt_file.is_file() else _json(tgt_file)
    src_pieces, src_order = id_table(src_vocab, ids, folder / "vocab.json")
    tgt_pieces, tgt_order = id_table(tgt_vocab, ids, tgt_file if tgt_vocab is not src_vocab
                                     else folder / "vocab.json")
    return Marian(model, src_pieces, tgt_pieces, src_order, tgt_order,
                  (folder / "source.spm").read_bytes(), (folder / "target.spm").read_bytes(),
                  read_weights(folder))


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MarianImportError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise MarianImportError(f"{path}: expected a JSON object")
    return data


def _refuse(path: Path, field: str, value, why: str) -> MarianImportError:
    return MarianImportError(f"{path}: {field}={value!r}: {why}")


def model_config(config: dict, path: Path) -> tuple[ModelConfig, dict[str, int]]:
    """The mtkit `ModelConfig` of a MarianConfig, and its special ids (eos, pad, the
    decoder's start); a field mtkit cannot represent exactly is refused."""
    if config.get("model_type") != "marian":
        raise _refuse(path, "model_type", config.get("model_type"),
                      "not a Marian model (mtkit imports Marian / OPUS-MT models)")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config.get(a) != config.get(b):
            raise _refuse(path, b, config.get(b), f"mtkit needs it equal to {a} "
                                                  f"({config.get(a)!r})")
    activation = ACTIVATIONS.get(config.get("activation_function", "gelu"))
    if activation is None:
        raise _refuse(path, "activation_function", config.get("activation_function"),
                      f"mtkit has {', '.join(ACTIVATIONS)}")
    for field, wanted in (("scale_embedding", True), ("tie_word_embeddings", True),
                          ("normalize_before", False), ("add_final_layer_norm", False),
                          ("normalize_embedding", False), ("static_position_embeddings", True)):
        if config.get(field, wanted) != wanted:
            raise _refuse(path, field, config.get(field), f"mtkit's Marian needs {wanted}")
    ids = {"eos": config.get("eos_token_id", 0), "pad": config.get("pad_token_id"),
           "start": config.get("decoder_start_token_id")}
    if ids["start"] != ids["pad"]:
        raise _refuse(path, "decoder_start_token_id", ids["start"],
                      f"mtkit maps Marian's start token to its bos only when it is the pad "
                      f"token ({ids['pad']!r})")
    try:
        model = ModelConfig(
            encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
            d_model=config["d_model"], heads=config["encoder_attention_heads"],
            ffn_dim=config["encoder_ffn_dim"], dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)),
            activation=activation, norm="post", positions="sinusoidal_split",
            max_positions=config["max_position_embeddings"],
            share_embeddings=bool(config.get("share_encoder_decoder_embeddings", True)),
            output_bias=True)
    except (KeyError, TypeError, ValueError) as e:
        raise MarianImportError(f"{path}: incomplete MarianConfig ({type(e).__name__}: {e})"
                                ) from None
    return model, ids


def id_table(vocab: dict, ids: dict[str, int], path: Path) -> tuple[list[str], list[int]]:
    """One side's pieces in mtkit id order, and each one's Marian id (-1: the new pad)."""
    pieces = {i: p for p, i in vocab.items() if isinstance(i, int)}
    if len(pieces) != len(vocab) or sorted(pieces) != list(range(len(pieces))):
        raise MarianImportError(f"{path}: ids must be 0..{len(vocab) - 1}, each once")
    unk = vocab.get("<unk>")
    if unk is None or ids["pad"] not in pieces or ids["eos"] not in pieces:
        raise MarianImportError(f"{path}: no <unk>, or no piece for the pad id "
                                f"{ids['pad']!r} or the eos id {ids['eos']!r}")
    special = {UNK: unk, BOS: ids["pad"], EOS: ids["eos"]}
    order = [-1, unk, ids["pad"], ids["eos"]] + [m for m in range(len(pieces))
                                                  if m not in special.values()]
    names = {PAD: "<pad>", BOS: "<s>"}  # mtkit's pad is new; bos is Marian's <pad> row
    return [names.get(i, pieces.get(m, "")) for i, m in enumerate(order)], order


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict, without running code: safetensors, or torch.load with
    weights_only=True (pytorch_model.bin)."""
    try:
        if (folder / "model.safetensors").is_file():
            from safetensors.torch import load_file

            return load_file(folder / "model.safetensors")
        if (folder / "pytorch_model.bin").is_file():
            weights = folder / "pytorch_model.bin"
            return torch.load(weights, map_location="cpu", weights_only=True)
    except ImportError:
        raise MarianImportError("model.safetensors needs safetensors: pip install "
                                "'mtkit[hf]'") from None
    except Exception as e:  # a corrupt or truncated file, whatever the reader says
        raise MarianImportError(f"{folder}: the weights file is not readable "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:100]})"
                                ) from None
    raise MarianImportError(f"{folder}: no model.safetensors or pytorch_model.bin")


def state_dict(marian: Marian) -> dict[str, torch.Tensor]:
    """The mtkit state dict of the Marian weights (rows permuted to mtkit's ids)."""
    w = {k.removeprefix("model."): v.float() for k, v in marian.weights.items()}
    cfg = marian.model

    def rows(table: torch.Tensor, order: list[int], fill: float = 0.0) -> torch.Tensor:
        out = table[torch.tensor([max(m, 0) for m in order])].clone()
        out[torch.tensor([m < 0 for m in order])] = fill
        return out

    def first(*names: str) -> torch.Tensor:
        for n in names:
            if n in w:
                return w[n]
        raise MarianImportError(f"the weights have none of {', '.join(names)}")

    tgt = rows(first("decoder.embed_tokens.weight", "shared.weight", "lm_head.weight"),
               marian.tgt_order)
    out = {"tgt_embed.tokens.weight": tgt}
    out["src_embed.tokens.weight"] = tgt if cfg.share_embeddings else rows(
        first("encoder.embed_tokens.weight", "shared.weight"), marian.src_order)
    bias = w.get("final_logits_bias", torch.zeros(1, len(marian.tgt_order) - 1))
    out["output_bias"] = rows(bias.reshape(-1), marian.tgt_order, NEVER)
    names = {"self_attn": "self_attn", "encoder_attn": "cross_attn", "fc1": "ffn.inner",
             "fc2": "ffn.outer", "self_attn_layer_norm": None, "encoder_attn_layer_norm": None,
             "final_layer_norm": "ffn_block.norm"}
    for stack, count, attn_norm in (("encoder", cfg.encoder_layers, "attn_block.norm"),
                                    ("decoder", cfg.decoder_layers, "self_block.norm")):
        norms = {"self_attn_layer_norm": attn_norm, "encoder_attn_layer_norm": "cross_block.norm"}
        for i in range(count):
            for key, value in w.items():
                prefix = f"{stack}.layers.{i}."
                if not key.startswith(prefix):
                    continue
                module, _, rest = key[len(prefix):].partition(".")
                ours = names.get(module) or norms.get(module)
                if ours is None:
                    raise MarianImportError(f"the weights have {key}, which mtkit's Marian "
                                            f"does not know")
                out[f"{stack}_layers.{i}.{ours}.{rest}"] = value
    return out


def import_marian(source: str | os.PathLike, output: str | os.PathLike) -> Path:
    """Write the mtkit checkpoint of the Marian model at `source` (a folder or a Hub
    name) to `output`, atomically. Returns the checkpoint's path."""
    folder = locate(source)
    marian = read_marian(folder)
    src_vocab = Vocab(marian.src_spm, marian.src_pieces)
    tgt_vocab = Vocab(marian.tgt_spm, marian.tgt_pieces)
    model = build_model(marian.model, len(src_vocab), len(tgt_vocab))
    theirs = state_dict(marian)
    ours = model.state_dict()
    missing = sorted(set(ours) - set(theirs))
    if missing or any(theirs[k].shape != ours[k].shape for k in ours):
        bad = missing[0] if missing else next(k for k in ours if theirs[k].shape != ours[k].shape)
        raise MarianImportError(f"{folder}: the weights do not fit the config ({bad}: "
                                f"{'missing' if missing else tuple(theirs[bad].shape)})")
    model.load_state_dict({k: theirs[k] for k in ours})
    cfg = Config(data=DataConfig(src_lang=_lang(folder, "source_lang", "src"),
                                 tgt_lang=_lang(folder, "target_lang", "tgt"),
                                 max_len=min(256, marian.model.max_positions - 2)),
                 model=marian.model)
    payload = {"config": config_to_dict(cfg), "vocab": vocab_entry(src_vocab, tgt_vocab),
               "model": model.state_dict(), "imported": {"from": str(source), "format":
                                                         "marian"}}
    save_checkpoint(payload, Path(output))
    log.info("imported %s: %d parameters", source, sum(p.numel() for p in model.parameters()))
    return Path(output)


def _lang(folder: Path, key: str, default: str) -> str:
    """A language from tokenizer_config.json (OPUS-MT's source_lang/target_lang)."""
    path = folder / "tokenizer_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get(key) if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        value = None
    return value if isinstance(value, str) and value else default

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

Nothing is written before everything is checked: every field read from config.json has
its type and range checked, and the sizes it gives are checked against the weights'
shapes before any model is built (so a config claiming 200,000 layers or a d_model of
10^6 is one line, not an allocation); both SentencePiece models must load and segment;
vocab.json must fit the embeddings. Every tensor in the weights file must be used or be
one Marian stores twice (the tied `lm_head`, the shared embedding's copies, the fixed
position table): one the config does not use is refused, naming it, since leaving it
out would give a model other than the one its author trained, and the import is exact
or nothing. The checkpoint written then passes mtkit's own config check, so it loads
and translates.

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
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from mtkit.core.checkpoint import save_checkpoint
from mtkit.core.config import Config, DataConfig, ModelConfig, config_from_dict, config_to_dict
from mtkit.core.errors import UserError
from mtkit.core.vocab import BOS, EOS, PAD, UNK, Vocab, vocab_entry
from mtkit.model.transformer import build_model

log = logging.getLogger(__name__)

NEVER = -1e4  # the new pad row's output bias: exp(NEVER - logits) is 0 in fp32 and bf16
FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
MAX_LAYERS = 64  # ModelConfig's own bound
# Positions get a sinusoid table each (positions x d_model floats, per stack) that no
# weight bounds when the file leaves it out, as transformers' save_pretrained does;
# OPUS-MT models have 512.
MAX_POSITIONS = 1 << 14
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
LANGUAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
# Tensors Marian stores that mtkit keeps once or computes: the output projection tied to
# the target embedding (tie_word_embeddings is required), and the fixed sinusoids.
TIED = ("lm_head.weight",)
POSITION_TABLES = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")


class MarianImportError(UserError, ValueError):
    """A folder or hub name that is not a Marian model mtkit can represent (one line)."""


@dataclass(frozen=True)
class Marian:
    """What the import reads: the architecture, both sides' id tables (mtkit order:
    `order[i]` is the Marian id of mtkit id i, -1 for the new pad row), the
    SentencePiece models and the weights (Marian's names, without `model.`)."""

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
    Hugging Face cache (offline: only what the cache holds). A path that names nothing
    is said to be missing before any Hub lookup: one that cannot be a Hub name, or whose
    first part is a local folder (`models/opus-mt`)."""
    path = Path(source)
    text = str(source)
    if path.is_dir():
        return path
    if path.exists():
        raise MarianImportError(
            f"{source}: a file, not a model folder (a Marian model in the Hugging Face layout)"
        )
    if not HUB_NAME.match(text) or ".." in text or Path(text.split("/")[0]).is_dir():
        raise MarianImportError(
            f"{source}: no such folder (a local path; a Hub name is "
            f"owner/name, such as Helsinki-NLP/opus-mt-en-de)"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MarianImportError(
            "a Hub name needs huggingface_hub: pip install 'mtkit[hf]'"
        ) from None
    patterns = [
        *FILES,
        "target_vocab.json",
        "model.safetensors",
        "pytorch_model.bin",
        "tokenizer_config.json",
    ]
    try:
        return Path(snapshot_download(text, allow_patterns=patterns))
    except Exception as e:  # offline and not cached, unknown name, network error
        raise MarianImportError(
            f"{source}: no such folder here, and cannot fetch it from "
            f"the Hugging Face Hub and it is not in the local cache "
            f"({type(e).__name__})"
        ) from None


def read_marian(folder: Path) -> Marian:
    """Everything the import needs from a model folder, each file checked, and the
    config checked against the weights."""
    for name in FILES:
        if not (folder / name).is_file():
            raise MarianImportError(
                f"{folder}: no {name}; a Marian model folder holds "
                f"{', '.join(FILES)} and its weights"
            )
    config = _json(folder / "config.json")
    weights = read_weights(folder)
    model, ids = model_config(config, folder / "config.json", weights)
    src_vocab = _json(folder / "vocab.json")
    tgt_file = folder / "target_vocab.json"
    separate = not model.share_embeddings and tgt_file.is_file()
    tgt_vocab = _json(tgt_file) if separate else src_vocab
    src_pieces, src_order = id_table(src_vocab, ids, folder / "vocab.json")
    tgt_pieces, tgt_order = id_table(
        tgt_vocab, ids, tgt_file if separate else folder / "vocab.json"
    )
    sides = (
        ("source", folder / "vocab.json", src_order, source_embedding(weights, model)),
        (
            "target",
            tgt_file if separate else folder / "vocab.json",
            tgt_order,
            target_embedding(weights),
        ),
    )
    for side, path, order, (name, table) in sides:
        if len(order) - 1 > table.size(0):  # mtkit's pad row is new
            raise MarianImportError(
                f"{path}: {len(order) - 1} pieces, but the {side} "
                f"embedding ({name}) has {table.size(0)} rows"
            )
    bias = weights.get("final_logits_bias")
    if bias is not None and bias.numel() < len(tgt_order) - 1:
        raise MarianImportError(
            f"{folder}: final_logits_bias has {bias.numel()} values, "
            f"fewer than the target's {len(tgt_order) - 1} pieces"
        )
    return Marian(
        model,
        src_pieces,
        tgt_pieces,
        src_order,
        tgt_order,
        _spm(folder / "source.spm"),
        _spm(folder / "target.spm"),
        weights,
    )


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MarianImportError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise MarianImportError(f"{path}: expected a JSON object")
    return data


def _spm(path: Path) -> bytes:
    """A SentencePiece model's bytes, once SentencePiece has loaded it and segmented a
    line with it."""
    import sentencepiece as spm

    data = path.read_bytes()
    if not data:  # SentencePiece would log to the C stderr and then fail
        raise MarianImportError(f"{path}: not a SentencePiece model (empty)")
    try:
        sp = spm.SentencePieceProcessor(model_proto=data)
        ok = sp.get_piece_size() > 0 and isinstance(sp.encode("A dog runs.", out_type=str), list)
    except Exception:  # sentencepiece says RuntimeError, or worse, for foreign bytes
        ok = False
    if not ok:
        what = "empty" if not data else f"{len(data)} bytes"
        raise MarianImportError(
            f"{path}: not a SentencePiece model ({what} that SentencePiece cannot load)"
        )
    return data


def _show(value) -> str:
    """A config value for a message: its JSON-ish repr, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(path: Path, field: str, value, why: str) -> MarianImportError:
    return MarianImportError(f"{path}: {field}={_show(value)}: {why}")


_MISSING = object()


def _field(
    config: dict,
    path: Path,
    field: str,
    kind: type,
    lo: float | None = None,
    hi: float | None = None,
    default=_MISSING,
):
    """One field of config.json, of type `kind` (int, float, bool or str) and within
    [lo, hi]; one line naming the field and its value otherwise."""
    value = config.get(field, default)
    if value is _MISSING:
        raise MarianImportError(f"{path}: no {field}; a MarianConfig gives it")
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    span = (
        f" in [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        if lo is not None or hi is not None
        else ""
    )
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _refuse(path, field, value, f"must be {names[kind]}{span}")
    if kind is float and not math.isfinite(value):
        raise _refuse(path, field, value, f"must be a finite number{span}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _refuse(path, field, value, f"must be {names[kind]}{span}")
    return value


def model_config(
    config: dict, path: Path, weights: dict[str, torch.Tensor]
) -> tuple[ModelConfig, dict[str, int]]:
    """The mtkit `ModelConfig` of a MarianConfig, and its special ids (eos, pad, the
    decoder's start). Every field read is checked for its type and range, then the sizes
    against the weights' shapes; a field mtkit cannot represent exactly is refused."""
    if config.get("model_type") != "marian":
        raise _refuse(
            path,
            "model_type",
            config.get("model_type"),
            "not a Marian model (mtkit imports Marian / OPUS-MT models)",
        )
    d_model = _field(config, path, "d_model", int, 1)
    layers = {
        stack: _field(config, path, f"{stack}_layers", int, 1, MAX_LAYERS)
        for stack in ("encoder", "decoder")
    }
    heads = _field(config, path, "encoder_attention_heads", int, 1, d_model)
    ffn_dim = _field(config, path, "encoder_ffn_dim", int, 1)
    for a, b, value in (
        ("encoder_attention_heads", "decoder_attention_heads", heads),
        ("encoder_ffn_dim", "decoder_ffn_dim", ffn_dim),
    ):
        if config.get(b) != value or isinstance(config.get(b), bool):
            raise _refuse(path, b, config.get(b), f"mtkit needs it equal to {a} ({value!r})")
    if d_model % heads:
        raise _refuse(
            path,
            "encoder_attention_heads",
            heads,
            f"must divide d_model ({d_model}) into equal heads",
        )
    name = _field(config, path, "activation_function", str, default="gelu")
    activation = ACTIVATIONS.get(name)
    if activation is None:
        raise _refuse(path, "activation_function", name, f"mtkit has {', '.join(ACTIVATIONS)}")
    for field, wanted in (
        ("scale_embedding", True),
        ("tie_word_embeddings", True),
        ("normalize_before", False),
        ("add_final_layer_norm", False),
        ("normalize_embedding", False),
        ("static_position_embeddings", True),
    ):
        if _field(config, path, field, bool, default=wanted) != wanted:
            raise _refuse(path, field, config.get(field), f"mtkit's Marian needs {wanted}")
    shared = _field(config, path, "share_encoder_decoder_embeddings", bool, default=True)
    dropout = {
        field: _field(config, path, field, float, 0.0, 0.9, default=default)
        for field, default in (("dropout", 0.1), ("attention_dropout", 0.0))
    }
    positions = _field(config, path, "max_position_embeddings", int, 8, MAX_POSITIONS)
    ids = {
        "eos": _field(config, path, "eos_token_id", int, 0, default=0),
        "pad": _field(config, path, "pad_token_id", int, 0),
        "start": _field(config, path, "decoder_start_token_id", int, 0),
    }
    if ids["start"] != ids["pad"]:
        raise _refuse(
            path,
            "decoder_start_token_id",
            ids["start"],
            f"mtkit maps Marian's start token to its bos only when it is the pad "
            f"token ({ids['pad']!r})",
        )
    model = ModelConfig(
        encoder_layers=layers["encoder"],
        decoder_layers=layers["decoder"],
        d_model=d_model,
        heads=heads,
        ffn_dim=ffn_dim,
        dropout=dropout["dropout"],
        attention_dropout=dropout["attention_dropout"],
        activation=activation,
        norm="post",
        positions="sinusoidal_split",
        max_positions=positions,
        share_embeddings=shared,
        output_bias=True,
    )
    check_against_weights(model, path, weights)
    return model, ids


def check_against_weights(cfg: ModelConfig, path: Path, weights: dict[str, torch.Tensor]) -> None:
    """The sizes config.json gives, against the weights' shapes (before any model is
    built, so that its size is the weights' own): d_model, ffn_dim, the layer counts,
    the position tables."""
    name, table = target_embedding(weights)
    if table.dim() != 2 or table.size(1) != cfg.d_model:
        raise _refuse(
            path, "d_model", cfg.d_model, f"the weights' {name} has shape {tuple(table.shape)}"
        )
    for stack in ("encoder", "decoder"):
        found = sorted(
            {int(m.group(1)) for k in weights if (m := re.match(rf"{stack}\.layers\.(\d+)\.", k))}
        )
        count = getattr(cfg, f"{stack}_layers")
        if found != list(range(count)):
            held = f"layers {found[0]}..{found[-1]}" if found else "no layers"
            raise _refuse(
                path,
                f"{stack}_layers",
                count,
                f"the weights hold {held} ({len(found)}) of the {stack}",
            )
        fc1 = weights.get(f"{stack}.layers.0.fc1.weight")
        if fc1 is None or tuple(fc1.shape) != (cfg.ffn_dim, cfg.d_model):
            got = "none" if fc1 is None else f"shape {tuple(fc1.shape)}"
            raise _refuse(
                path,
                f"{stack}_ffn_dim",
                cfg.ffn_dim,
                f"the weights' {stack}.layers.0.fc1.weight has {got}",
            )
    for key in POSITION_TABLES:
        if key in weights and tuple(weights[key].shape) != (cfg.max_positions, cfg.d_model):
            raise _refuse(
                path,
                "max_position_embeddings",
                cfg.max_positions,
                f"the weights' {key} has shape {tuple(weights[key].shape)}",
            )


def target_embedding(weights: dict[str, torch.Tensor]) -> tuple[str, torch.Tensor]:
    """The target embedding (and tied output projection): its name and tensor."""
    return _first(weights, "decoder.embed_tokens.weight", "shared.weight", "lm_head.weight")


def source_embedding(
    weights: dict[str, torch.Tensor], cfg: ModelConfig
) -> tuple[str, torch.Tensor]:
    """The source embedding: the target's when shared."""
    if cfg.share_embeddings:
        return target_embedding(weights)
    return _first(weights, "encoder.embed_tokens.weight", "shared.weight")


def _first(weights: dict[str, torch.Tensor], *names: str) -> tuple[str, torch.Tensor]:
    for n in names:
        if n in weights:
            return n, weights[n]
    raise MarianImportError(f"the weights have none of {', '.join(names)}")


def id_table(vocab: dict, ids: dict[str, int], path: Path) -> tuple[list[str], list[int]]:
    """One side's pieces in mtkit id order, and each one's Marian id (-1: the new pad)."""
    pieces = {i: p for p, i in vocab.items() if isinstance(i, int) and not isinstance(i, bool)}
    if len(pieces) != len(vocab) or sorted(pieces) != list(range(len(pieces))):
        raise MarianImportError(f"{path}: ids must be 0..{len(vocab) - 1}, each once")
    unk = vocab.get("<unk>")
    if unk is None or ids["pad"] not in pieces or ids["eos"] not in pieces:
        raise MarianImportError(
            f"{path}: no <unk>, or no piece for the pad id "
            f"{ids['pad']!r} or the eos id {ids['eos']!r}"
        )
    if len({unk, ids["pad"], ids["eos"]}) < 3:
        raise MarianImportError(
            f"{path}: <unk> ({unk}), the pad id ({ids['pad']}) and the "
            f"eos id ({ids['eos']}) must be three different pieces"
        )
    special = {UNK: unk, BOS: ids["pad"], EOS: ids["eos"]}
    order = [-1, unk, ids["pad"], ids["eos"]] + [
        m for m in range(len(pieces)) if m not in special.values()
    ]
    names = {PAD: "<pad>", BOS: "<s>"}  # mtkit's pad is new; bos is Marian's <pad> row
    return [names.get(i, pieces.get(m, "")) for i, m in enumerate(order)], order


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict, without running code: safetensors, or torch.load with
    weights_only=True (pytorch_model.bin). Names lose MarianMTModel's `model.` prefix;
    every value must be a tensor of finite floats."""
    try:
        if (folder / "model.safetensors").is_file():
            from safetensors.torch import load_file

            name, weights = "model.safetensors", load_file(folder / "model.safetensors")
        elif (folder / "pytorch_model.bin").is_file():
            name, weights = (
                "pytorch_model.bin",
                torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True),
            )
        else:
            raise MarianImportError(f"{folder}: no model.safetensors or pytorch_model.bin")
    except ImportError:
        raise MarianImportError(
            "model.safetensors needs safetensors: pip install 'mtkit[hf]'"
        ) from None
    except MarianImportError:
        raise
    except Exception as e:  # a corrupt or truncated file, whatever the reader says
        raise MarianImportError(
            f"{folder}: the weights file is not readable "
            f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]})"
        ) from None
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise MarianImportError(f"{folder / name}: not a state dict (names -> tensors)")
    for key, value in weights.items():
        if not value.is_floating_point() or not bool(torch.isfinite(value).all()):
            raise MarianImportError(
                f"{folder / name}: {key} is not a tensor of finite floats ({value.dtype})"
            )
    return {k.removeprefix("model."): v for k, v in weights.items()}


def state_dict(marian: Marian) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The mtkit state dict of the Marian weights (rows permuted to mtkit's ids), and the
    names of the weights it does not use (Marian's copies of one tensor aside)."""
    w = {k: v.float() for k, v in marian.weights.items()}
    cfg = marian.model
    used = {*TIED, *POSITION_TABLES, "final_logits_bias"}

    def rows(table: torch.Tensor, order: list[int], fill: float = 0.0) -> torch.Tensor:
        out = table[torch.tensor([max(m, 0) for m in order])].clone()
        out[torch.tensor([m < 0 for m in order])] = fill
        return out

    tgt_name, tgt_table = target_embedding(w)
    src_name, src_table = source_embedding(w, cfg)
    if cfg.share_embeddings:  # MarianMTModel ties these to `shared`: copies of one tensor
        used |= {"shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    used |= {tgt_name, src_name}
    tgt = rows(tgt_table, marian.tgt_order)
    out = {"tgt_embed.tokens.weight": tgt}
    out["src_embed.tokens.weight"] = (
        tgt if cfg.share_embeddings else rows(src_table, marian.src_order)
    )
    bias = w.get("final_logits_bias", torch.zeros(1, len(marian.tgt_order) - 1))
    out["output_bias"] = rows(bias.reshape(-1), marian.tgt_order, NEVER)
    names = {
        "self_attn": "self_attn",
        "encoder_attn": "cross_attn",
        "fc1": "ffn.inner",
        "fc2": "ffn.outer",
        "self_attn_layer_norm": None,
        "encoder_attn_layer_norm": None,
        "final_layer_norm": "ffn_block.norm",
    }
    for stack, count, attn_norm in (
        ("encoder", cfg.encoder_layers, "attn_block.norm"),
        ("decoder", cfg.decoder_layers, "self_block.norm"),
    ):
        norms = {"self_attn_layer_norm": attn_norm, "encoder_attn_layer_norm": "cross_block.norm"}
        for i in range(count):
            prefix = f"{stack}.layers.{i}."
            for key, value in w.items():
                if not key.startswith(prefix):
                    continue
                module, _, rest = key[len(prefix) :].partition(".")
                ours = names.get(module) or norms.get(module)
                if ours is None:
                    raise MarianImportError(
                        f"the weights have {key}, which mtkit's Marian does not know"
                    )
                out[f"{stack}_layers.{i}.{ours}.{rest}"] = value
                used.add(key)
    return out, sorted(set(w) - used)


def import_marian(source: str | os.PathLike, output: str | os.PathLike) -> Path:
    """Write the mtkit checkpoint of the Marian model at `source` (a folder or a Hub
    name) to `output`, atomically, once everything is checked. Returns its path."""
    if str(output) == "-":
        raise MarianImportError("-o -: the import writes a checkpoint file; name one")
    if Path(output).is_dir():
        raise MarianImportError(f"-o {output} is a folder; name the checkpoint file to write")
    folder = locate(source)
    marian = read_marian(folder)
    src_vocab = Vocab(marian.src_spm, marian.src_pieces)
    tgt_vocab = Vocab(marian.tgt_spm, marian.tgt_pieces)
    theirs, unused = state_dict(marian)
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise MarianImportError(
            f"{folder}: the weights hold {', '.join(unused[:3])}{more}, "
            f"which the config does not use; mtkit imports a model "
            f"exactly or not at all"
        )
    model = build_model(marian.model, len(src_vocab), len(tgt_vocab))
    ours = model.state_dict()
    missing = sorted(set(ours) - set(theirs))
    extra = sorted(set(theirs) - set(ours))
    wrong = [k for k in ours if k in theirs and theirs[k].shape != ours[k].shape]
    if missing or extra or wrong:
        bad = (missing or extra or wrong)[0]
        why = (
            "missing"
            if missing
            else "not in the model"
            if extra
            else f"{tuple(theirs[bad].shape)}, the config gives {tuple(ours[bad].shape)}"
        )
        raise MarianImportError(f"{folder}: the weights do not fit the config ({bad}: {why})")
    model.load_state_dict({k: theirs[k] for k in ours})
    cfg = Config(
        data=DataConfig(
            src_lang=_lang(folder, "source_lang", "src"),
            tgt_lang=_lang(folder, "target_lang", "tgt"),
            max_len=min(256, marian.model.max_positions - 2),
        ),
        model=marian.model,
    )
    try:  # what loading the checkpoint will check (`engines.pytorch_loading.load_model`)
        config_from_dict(config_to_dict(cfg))
    except UserError as e:
        raise MarianImportError(
            f"{folder}: the imported config would not load ({e.line()})"
        ) from None
    payload = {
        "config": config_to_dict(cfg),
        "vocab": vocab_entry(src_vocab, tgt_vocab),
        "model": model.state_dict(),
        "imported": {"from": str(source), "format": "marian"},
    }
    save_checkpoint(payload, Path(output))
    log.info("imported %s: %d parameters", source, sum(p.numel() for p in model.parameters()))
    return Path(output)


def _lang(folder: Path, key: str, default: str) -> str:
    """A language from tokenizer_config.json (OPUS-MT's source_lang/target_lang); one
    that is missing, or no language code (letters, digits, - and _), gives `default`,
    with a warning naming the field when one was given."""
    path = folder / "tokenizer_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        log.warning("%s: not readable JSON; the languages are %s", path, default)
        return default
    value = data.get(key) if isinstance(data, dict) else None
    if value is None:
        return default
    if isinstance(value, str) and LANGUAGE.match(value):
        return value
    log.warning(
        "%s: %s=%s is not a language code (letters, digits, - and _); the checkpoint calls it %s",
        path,
        key,
        _show(value),
        default,
    )
    return default

"""CTranslate2: `mtkit export` writes a checkpoint as a self-contained CTranslate2 model
folder, and `CT2Translator` translates with one (`pip install 'mtkit[ct2]'`).

    DIR/model.bin            the weights, in CTranslate2's format (optionally quantized)
    DIR/shared_vocabulary.json or source_/target_vocabulary.json   CTranslate2's vocabularies
    DIR/source.spm, target.spm                                      the SentencePiece models
    DIR/mtkit.json           the checkpoint's config (decoding defaults, languages,
                             architecture) and step, the quantization, and every other
                             file's size and SHA-256

Every variant mtkit trains maps onto CTranslate2's `TransformerSpec`: post- or pre-norm,
sinusoidal or learned positions (the exact table is stored: mtkit's sinusoids interleave
sin and cos, which CTranslate2's built-in table does not), ReLU or GELU, shared or
separate embeddings. The output projection is tied to the target embedding, without bias.
The folder is written beside its final place and renamed when complete. `--force`
replaces only a previous export: never a folder that holds anything else (a checkpoint,
a run directory, the current folder). Loading a folder checks every file against
mtkit.json first, so a damaged or truncated file is one line naming it, not a wrong
translation or a CTranslate2 traceback.

Translating with a folder needs no torch: this module imports it only to export.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtkit.atomic import atomic_dir
from mtkit.checksum import file_sha256
from mtkit.config import config_from_dict, config_to_dict
from mtkit.errors import OptionError, UserError
from mtkit.hypothesis import Hypothesis, length_penalty
from mtkit.translate import DecodeOptions, Frontend
from mtkit.vocab import BOS, PAD, Vocab

if TYPE_CHECKING:
    from mtkit.model import Transformer

log = logging.getLogger(__name__)

MANIFEST = "mtkit.json"
FORMAT = "mtkit-ct2-1"
# Every name an export holds (CTranslate2's files, of this release and older ones, then
# mtkit's): `--force` replaces a folder that holds nothing else.
EXPORT_FILES = frozenset({"model.bin", "config.json", "shared_vocabulary.json",
                          "source_vocabulary.json", "target_vocabulary.json",
                          "shared_vocabulary.txt", "source_vocabulary.txt",
                          "target_vocabulary.txt", "source.spm", "target.spm", MANIFEST})
AGAIN = "export the checkpoint again"
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                 "bfloat16", "float16")


class ExportError(UserError, ValueError):
    """A user error of `mtkit export` (one line)."""


def ctranslate2_module():
    try:
        import ctranslate2
    except ImportError:
        raise ExportError("CTranslate2 is not installed: pip install 'mtkit[ct2]'") from None
    return ctranslate2


def is_export(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder written by `export_ctranslate2`."""
    return Path(path, MANIFEST).is_file() and Path(path, "model.bin").is_file()


def check_quantization(quantization: str, device: str = "cpu") -> None:
    """One line when this machine cannot run `quantization` on `device`."""
    ct2 = ctranslate2_module()
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, "
                          f"got {quantization!r}")
    supported = ct2.get_supported_compute_types(device)
    if quantization not in supported:
        raise ExportError(f"--quantization {quantization} is not supported on this "
                          f"{device.upper()} (supported: {', '.join(sorted(supported))})")


def export_target(output: str | os.PathLike, checkpoint: str | os.PathLike,
                  force: bool = False) -> Path:
    """The folder that exporting `checkpoint` to `-o output` may (re)place: `output` with
    its symbolic links resolved. Refused in one line: a file, `-`, the current folder or
    a folder above it, a folder that holds the checkpoint, and a non-empty folder unless
    `force` is given and it is a previous export that holds nothing else."""
    if str(output) == "-":
        raise ExportError("-o -: an export is a folder, not a stream; name a folder")
    target = Path(os.path.realpath(output))
    if target.exists() and not target.is_dir():
        raise ExportError(f"{output} is a file; -o must name a folder")
    here = Path(os.path.realpath(os.curdir))
    if target == here or target in here.parents:
        raise ExportError(f"-o {output} is the current folder or one above it, which "
                          f"exporting would replace; name a new folder")
    if target in Path(os.path.realpath(checkpoint)).parents:
        raise ExportError(f"{output} holds the checkpoint {checkpoint}; export to another "
                          f"folder")
    if not target.is_dir() or not any(target.iterdir()):
        return target
    if not force:
        raise ExportError(f"{output} exists and is not empty; add --force to replace it")
    foreign = sorted((p.name for p in target.iterdir()
                      if p.name not in EXPORT_FILES or p.is_symlink() or not p.is_file()),
                     key=lambda name: (name.startswith("."), name))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise ExportError(f"{output} holds {foreign[0]}{more}, which an export does not; "
                          f"--force replaces only a previous export")
    if not is_export(target) or _manifest_format(target) != FORMAT:
        raise ExportError(f"{output} is not an mtkit export (no readable {MANIFEST} and "
                          f"model.bin); --force replaces only a previous export")
    return target


def _manifest_format(folder: Path) -> object:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest.get("format") if isinstance(manifest, dict) else None


def export_ctranslate2(checkpoint: str | os.PathLike, output: str | os.PathLike,
                       quantization: str = "float32", force: bool = False) -> Path:
    """Write the CTranslate2 folder of `checkpoint` to `output` (atomically); `force`
    replaces a previous export there (`export_target`)."""
    from mtkit.native import load_model

    ct2 = ctranslate2_module()
    check_quantization(quantization)
    target = export_target(output, checkpoint, force)
    model, src_vocab, tgt_vocab, cfg, step = load_model(checkpoint)
    spec = model_spec(model, [src_vocab.piece(i) for i in range(len(src_vocab))],
                      [tgt_vocab.piece(i) for i in range(len(tgt_vocab))])

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
        files = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in sorted(tmp.iterdir())}
        manifest = json.dumps({"format": FORMAT, "checkpoint": str(checkpoint), "step": step,
                               "quantization": quantization, "files": files,
                               "config": config_to_dict(cfg)}, indent=1, default=str)
        # All of tmp is renamed into place at the end, so a partial file is never seen:
        (tmp / MANIFEST).write_text(manifest + "\n")  # written in place on purpose
    return output


def model_spec(model: Transformer, src_pieces: list[str], tgt_pieces: list[str]):
    """The CTranslate2 `TransformerSpec` of an mtkit model, weights set."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    activation = {"relu": common_spec.Activation.RELU,
                  "gelu": common_spec.Activation.GELU}[cfg.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=cfg.norm == "pre",
        activation=activation)
    spec.config.layer_norm_epsilon = model.encoder_layers[0].attn_block.norm.eps
    spec.config.add_source_eos = True  # mtkit's sources end with eos
    spec.config.decoder_start_token = "<s>"
    weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}

    def get(name: str):
        return weights[name]

    def linear(target, *names: str, bias: bool = True) -> None:
        """Set a (possibly fused) linear layer from mtkit's `names` (concatenated)."""
        target.weight = np.concatenate([get(f"{n}.weight") for n in names])
        if bias:
            target.bias = np.concatenate([get(f"{n}.bias") for n in names])

    def norm(target, name: str) -> None:
        target.gamma, target.beta = get(f"{name}.weight"), get(f"{name}.bias")

    def inputs(target, embed) -> None:
        tokens = target.embeddings[0] if isinstance(target.embeddings, list) \
            else target.embeddings  # the encoder has a list (source features)
        tokens.weight = embed.tokens.weight.detach().float().numpy()
        table = (embed.learned.weight if embed.learned is not None else embed.sinusoidal)
        target.position_encodings.encodings = table.detach().float().numpy()
        target.scale_embeddings = True  # tokens * sqrt(d_model), then + positions

    def self_attention_and_ffn(layer, p: str, attn_block: str) -> None:
        linear(layer.self_attention.linear[0], *(f"{p}.self_attn.{x}_proj" for x in "qkv"))
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.{attn_block}.norm")
        linear(layer.ffn.linear_0, f"{p}.ffn.inner")
        linear(layer.ffn.linear_1, f"{p}.ffn.outer")
        norm(layer.ffn.layer_norm, f"{p}.ffn_block.norm")

    inputs(spec.encoder, model.src_embed)
    for i, layer in enumerate(spec.encoder.layer):
        self_attention_and_ffn(layer, f"encoder_layers.{i}", "attn_block")
    inputs(spec.decoder, model.tgt_embed)
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder_layers.{i}"
        self_attention_and_ffn(layer, p, "self_block")
        linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
        linear(layer.attention.linear[1], f"{p}.cross_attn.k_proj", f"{p}.cross_attn.v_proj")
        linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
        norm(layer.attention.layer_norm, f"{p}.cross_block.norm")
    if cfg.norm == "pre":
        norm(spec.encoder.layer_norm, "encoder_norm")
        norm(spec.decoder.layer_norm, "decoder_norm")
    spec.decoder.projection.weight = model.output_weight.detach().float().numpy()
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)
    return spec


# --- translating with an exported folder -----------------------------------------------


class CT2Translator(Frontend):
    """An exported folder behind `Translator`'s interface: same input handling (empty
    lines, truncation, prefixes), same `Hypothesis` results, through
    `ctranslate2.Translator`.

    CTranslate2's beam search ranks by log-probability over length^alpha, not by
    GNMT's penalty, so this path searches by plain log-probability and re-ranks the
    beam's N finished hypotheses by the GNMT score, as mtkit reports it. Sampling (per-
    line seeds), alignments and ensembles need a checkpoint."""

    can_align = False

    def __init__(self, folder: str | os.PathLike, device: str = "auto",
                 device_option: str = "--device"):
        ct2 = ctranslate2_module()
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            checked = check_files(folder, manifest)
            self.config = config_from_dict(manifest["config"], str(folder / MANIFEST))
            self.src_vocab = Vocab.load(folder / "source.spm")
            self.tgt_vocab = Vocab.load(folder / "target.spm")
        except ExportError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ExportError(f"{folder}: not a readable mtkit export ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:100] if str(e) else ''})") from None
        self.device = ct2_device(ct2, device, device_option)
        self.steps = [manifest.get("step")]
        self.quantization = manifest.get("quantization", "float32")
        self.max_positions = self.config.model.max_positions
        self._truncated: set[str] = set()
        # Where torch is loaded too (tests, benchmarks), keep its thread count:
        # CTranslate2 would otherwise set OpenMP's for the whole process.
        torch = sys.modules.get("torch")
        try:
            self.engine = ct2.Translator(str(folder), device=self.device,
                                         compute_type="default",
                                         intra_threads=torch.get_num_threads() if torch else 0)
        except (RuntimeError, ValueError, OSError) as e:  # an export without checksums
            where = folder if checked else folder / "model.bin"  # (checked: files intact)
            raise ExportError(f"{where}: CTranslate2 cannot load the export "
                              f"({str(e).splitlines()[0][:100] if str(e) else type(e).__name__}"
                              f"); {AGAIN}") from None
        if not checked:  # after loading: a folder that fails to load says only why
            log.warning("%s was exported without checksums (an older mtkit): its files are "
                        "not checked; %s to have them", folder, AGAIN)

    def describe(self) -> dict:
        return {"engine": f"ctranslate2 ({self.quantization})", "models": 1,
                "parameters": None}

    def translate(self, lines: list[str], opts: DecodeOptions,
                  done: Callable[[int], None] | None = None,
                  prefixes: list[str] | None = None) -> list[list[Hypothesis]]:
        refuse_unsupported(opts)
        done = done or (lambda n: None)
        out, todo, ids, forced = self.prepare(lines, opts, done, prefixes)
        if not todo:
            return out
        top = self.max_positions - 1
        a, b = min(opts.max_len_a, top), min(opts.max_len_b, top)  # huge: no overflow
        limits = [min(max(math.floor(a * (len(x) + 1) + b), 1,
                          len(forced[k]) + 1 if forced else 1), top)
                  for k, x in enumerate(ids)]  # each sentence's output limit, as native
        # One call with the longest limit; the few outputs that run past their own limit
        # are searched again with it (CTranslate2 takes one limit per call).
        results = self._search(ids, forced, range(len(ids)), max(limits), opts)
        over = [k for k in range(len(ids))
                if max(len(h) for h in results[k].hypotheses) > limits[k]]
        for limit in sorted({limits[k] for k in over}):
            group = [k for k in over if limits[k] == limit]
            for k, result in zip(group, self._search(ids, forced, group, limit, opts),
                                 strict=True):
                results[k] = result
        for k, result in enumerate(results):
            out[todo[k]] = self._ranked(result, opts)
        done(len(todo))
        return out

    def _search(self, ids: list[list[int]], forced: list[list[int]] | None, rows, limit: int,
                opts: DecodeOptions) -> list:
        """CTranslate2's search of the sentences `rows`, outputs of at most `limit` tokens."""
        src, tgt = self.src_vocab.piece, self.tgt_vocab.piece
        return self.engine.translate_batch(
            [[src(i) for i in ids[k]] for k in rows],
            target_prefix=[[tgt(i) for i in forced[k]] or None for k in rows] if forced
            else None,
            beam_size=opts.beam, num_hypotheses=opts.beam, length_penalty=0.0,
            max_decoding_length=limit, min_decoding_length=1,
            no_repeat_ngram_size=opts.no_repeat_ngram, return_scores=True,
            suppress_sequences=[[tgt(PAD)], [tgt(BOS)]],
            max_batch_size=opts.batch_tokens, batch_type="tokens")

    def _ranked(self, result, opts: DecodeOptions) -> list[Hypothesis]:
        """The N finished hypotheses re-ranked by GNMT score; the `nbest` best."""
        to_id = self.tgt_vocab.piece_id
        hyps = []
        for tokens, log_prob in zip(result.hypotheses, result.scores, strict=True):
            ids = [to_id(p) for p in tokens]
            hyps.append(Hypothesis(ids, log_prob,
                                   log_prob / length_penalty(len(ids) + 1, opts.lenpen)))
        return sorted(hyps, key=lambda h: -h.score)[: opts.nbest]


def check_files(folder: Path, manifest: dict) -> bool:
    """Every file that mtkit.json lists, against its size and SHA-256 there: the first
    that is missing or differs is one line naming it. False for an export made before
    mtkit recorded them (nothing to check)."""
    files = manifest.get("files")
    if files is None:
        return False
    if not isinstance(files, dict) or "model.bin" not in files:
        raise ExportError(f"{folder / MANIFEST}: corrupt (its list of files is damaged); "
                          f"{AGAIN}")
    for name, expected in files.items():
        path = folder / name
        if Path(name).name != name or not isinstance(expected, dict):
            raise ExportError(f"{folder / MANIFEST}: corrupt (bad entry {name[:60]!r}); "
                              f"{AGAIN}")
        if not path.is_file():
            raise ExportError(f"{path}: missing from the export; {AGAIN}")
        size = path.stat().st_size
        if size != expected.get("bytes"):
            raise ExportError(f"{path}: {size} bytes, {MANIFEST} says {expected.get('bytes')} "
                              f"(truncated or changed since the export); {AGAIN}")
        if file_sha256(path) != expected.get("sha256"):
            raise ExportError(f"{path}: its SHA-256 does not match {MANIFEST} (corrupt or "
                              f"changed since the export); {AGAIN}")
    return True


def ct2_device(ct2, name: str, option: str = "--device") -> str:
    """`auto` -> "cuda" when CTranslate2 sees a CUDA device, else "cpu"; asking for CUDA
    without one is an error naming `option`, as for a checkpoint."""
    if name == "cuda" or (name == "auto" and ct2.get_cuda_device_count() > 0):
        if ct2.get_cuda_device_count() == 0:
            raise OptionError(f"{option} cuda, but no CUDA device is available (use "
                              f"{option} auto or cpu)")
        return "cuda"
    return "cpu"


def refuse_unsupported(opts: DecodeOptions) -> None:
    """One line for the options that the CTranslate2 path cannot honour."""
    for name, wanted in (("--sampling", opts.sampling), ("--alignments", opts.alignments)):
        if wanted:
            raise OptionError(f"{name} needs a checkpoint (-m FILE.pt), not an exported "
                              f"CTranslate2 folder")

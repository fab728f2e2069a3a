"""The CTranslate2 runtime: translate with a folder made by `mtkit export`
(`pip install 'mtkit[ct2]'`), without torch.

    DIR/model.bin            the weights, in CTranslate2's format (optionally quantized)
    DIR/shared_vocabulary.json or source_/target_vocabulary.json   CTranslate2's vocabularies
    DIR/source.spm, target.spm                                      the SentencePiece models
    DIR/mtkit.json           the checkpoint's config (decoding defaults, languages,
                             architecture) and step, the quantization, and every other
                             file's size and SHA-256

Loading a folder checks every file against mtkit.json first, so a damaged or truncated
file is one line naming it, not a wrong translation or a CTranslate2 traceback. The
exporter is `mtkit.interop.ct2_export`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mtkit.core.checksum import file_sha256
from mtkit.core.config import config_from_dict
from mtkit.core.errors import OptionError, UserError
from mtkit.core.hypothesis import Hypothesis, length_penalty
from mtkit.core.search_options import (
    BATCH_TOKENS,
    Capabilities,
    SearchOptions,
    check_constraints,
    cpu_workers,
    flag,
    worker_threads,
)
from mtkit.core.vocab import BOS, PAD, Vocab
from mtkit.engines.base import EngineBase

log = logging.getLogger(__name__)

MANIFEST = "mtkit.json"
FORMAT = "mtkit-ct2-1"
# Every name an export holds (CTranslate2's files, of this release and older ones, then
# mtkit's): `--force` replaces a folder that holds nothing else.
EXPORT_FILES = frozenset(
    {
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "source_vocabulary.json",
        "target_vocabulary.json",
        "shared_vocabulary.txt",
        "source_vocabulary.txt",
        "target_vocabulary.txt",
        "source.spm",
        "target.spm",
        MANIFEST,
    }
)
AGAIN = "export the checkpoint again"


class ExportError(UserError, ValueError):
    """A user error of `mtkit export` (one line)."""


def ctranslate2_module():
    try:
        import ctranslate2
    except ImportError:
        raise ExportError("CTranslate2 is not installed: pip install 'mtkit[ct2]'") from None
    return ctranslate2


def looks_exported(path: str | os.PathLike) -> bool:
    """Whether `path` holds what an exported folder must (`mtkit.json`, model.bin)."""
    return Path(path, MANIFEST).is_file() and Path(path, "model.bin").is_file()


class CT2Engine(EngineBase):
    """An exported folder behind `Translator`'s interface: same input handling (empty
    lines, truncation, prefixes), same `Hypothesis` results, through
    `ctranslate2.Translator`.

    CTranslate2's beam search ranks by log-probability over length^alpha, not by
    GNMT's penalty, so this path searches by plain log-probability and re-ranks the
    beam's N finished hypotheses by the GNMT score, as mtkit reports it. Sampling (per-
    line seeds), alignments and ensembles need a checkpoint."""

    capabilities = Capabilities(
        sampling=False,
        alignments=False,
        streaming=False,
        needs="a checkpoint (-m FILE.pt), not an exported CTranslate2 folder",
    )

    def __init__(
        self,
        folder: str | os.PathLike,
        device: str = "auto",
        device_option: str = "--device",
        workers: int | None = None,
    ):
        super().__init__()
        ct2 = ctranslate2_module()
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            check_format(folder, manifest)
            check_files(folder, manifest)
            self.config = config_from_dict(manifest["config"], str(folder / MANIFEST))
            self.src_vocab = Vocab((folder / "source.spm").read_bytes(), manifest.get("src_pieces"))
            self.tgt_vocab = Vocab(
                (folder / "target.spm").read_bytes(),
                manifest.get("tgt_pieces"),
                manifest.get("tgt_languages"),
            )
            self.steps = [manifest["step"]]
            self.weights = [manifest["weights"]]
            self.quantization = manifest["quantization"]
        except ExportError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ExportError(
                f"{folder}: not a readable mtkit export ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:100] if str(e) else ''})"
            ) from None
        self.device = ct2_device(ct2, device, device_option)
        self.vocabulary_map = (folder / "vmap.txt").is_file()  # a student's shortlist
        self.max_positions = self.config.model.max_positions
        self.workers, threads = ct2_threads(
            self.config.decode.workers if workers is None else workers, self.device
        )
        try:
            self.engine = ct2.Translator(
                str(folder),
                device=self.device,
                compute_type="default",
                inter_threads=self.workers,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError, OSError) as e:  # its files are intact (checked)
            raise ExportError(
                f"{folder}: CTranslate2 cannot load the export "
                f"({str(e).splitlines()[0][:100] if str(e) else type(e).__name__}"
                f"); {AGAIN}"
            ) from None

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        if options.shortlist and not self.vocabulary_map:
            raise OptionError(
                f"{spell('shortlist')}: this export has no vocabulary map (export a "
                f"distilled student's checkpoint: its shortlist becomes vmap.txt)",
                "shortlist",
            )
        super().check(replace(options, shortlist=False), spell)

    def describe(self) -> dict:
        return {
            "engine": f"ctranslate2 ({self.quantization})",
            "models": 1,
            "parameters": None,
            "device": self.device,
        }

    def translate(
        self,
        lines: list[str],
        opts: SearchOptions,
        done: Callable[[int], None] | None = None,
        prefixes: list[str] | None = None,
        *,
        batch_tokens: int = BATCH_TOKENS,
        constraints: list[list[tuple[str, ...]]] | None = None,
        links: list[bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each line, in input order (`mtkit.engines.base.Translator`).
        CTranslate2 has no hard lexical constraints (only prefixes): constraints are
        refused in one line; nor word links (`links` is never read: `check` refuses
        alignments)."""
        self.check(opts)
        if constraints and any(constraints):
            check_constraints(opts, self.capabilities)
        done = done or (lambda n: None)
        out, todo, ids, forced = self.prepare(lines, opts, done, prefixes)
        if not todo:
            return out
        top = self.max_positions - 1
        a, b = min(opts.max_len_a, top), min(opts.max_len_b, top)  # huge: no overflow
        limits = [
            min(max(math.floor(a * (len(x) + 1) + b), 1, len(forced[k]) + 1 if forced else 1), top)
            for k, x in enumerate(ids)
        ]  # each sentence's output limit, as native
        # Per output vocabulary (`output_groups`), one call with the longest limit; the
        # few outputs that run past their own limit are searched again with it
        # (CTranslate2 takes one limit per call).
        for banned, group in self.output_groups(ids, forced, opts):
            results = dict(
                zip(
                    group,
                    self._search(
                        ids,
                        forced,
                        group,
                        max(limits[k] for k in group),
                        opts,
                        batch_tokens,
                        banned,
                    ),
                    strict=True,
                )
            )
            over = [k for k in group if max(len(h) for h in results[k].hypotheses) > limits[k]]
            for limit in sorted({limits[k] for k in over}):
                again = [k for k in over if limits[k] == limit]
                for k, result in zip(
                    again,
                    self._search(ids, forced, again, limit, opts, batch_tokens, banned),
                    strict=True,
                ):
                    results[k] = result
            for k, result in results.items():
                out[todo[k]] = self._ranked(result, opts)
        done(len(todo))
        return out

    def _search(
        self,
        ids: list[list[int]],
        forced: list[list[int]] | None,
        rows,
        limit: int,
        opts: SearchOptions,
        batch_tokens: int,
        banned: list[int],
    ) -> list:
        """CTranslate2's search of the sentences `rows`, outputs of at most `limit` tokens
        and none of the `banned` ids, in batches of at most `batch_tokens` / beam source
        tokens (as the PyTorch engine's: CTranslate2 counts source tokens, the search
        carries beam rows each)."""
        src, tgt = self.src_vocab.piece, self.tgt_vocab.piece
        return self.engine.translate_batch(
            [[src(i) for i in ids[k]] for k in rows],
            target_prefix=[[tgt(i) for i in forced[k]] or None for k in rows] if forced else None,
            beam_size=opts.beam,
            num_hypotheses=opts.beam,
            length_penalty=0.0,
            max_decoding_length=limit,
            min_decoding_length=1,
            no_repeat_ngram_size=opts.no_repeat_ngram,
            use_vmap=opts.shortlist,
            return_scores=True,
            suppress_sequences=[[tgt(PAD)], [tgt(BOS)]] + [[tgt(i)] for i in banned],
            max_batch_size=max(batch_tokens // opts.beam, 1),
            batch_type="tokens",
        )

    def _ranked(self, result, opts: SearchOptions) -> list[Hypothesis]:
        """The N finished hypotheses re-ranked by GNMT score; the `nbest` best."""
        to_id = self.tgt_vocab.piece_id
        hyps = []
        for tokens, log_prob in zip(result.hypotheses, result.scores, strict=True):
            ids = [to_id(p) for p in tokens]
            hyps.append(
                Hypothesis(ids, log_prob, log_prob / length_penalty(len(ids) + 1, opts.lenpen))
            )
        return sorted(hyps, key=lambda h: -h.score)[: opts.nbest]


def ct2_threads(workers: int, device: str) -> tuple[int, int]:
    """CTranslate2's (inter_threads, intra_threads) for `workers` (decode.workers; 0:
    auto): on a CPU, that many batches at once, each on its share of the threads
    (torch's count where torch is loaded too, so as to keep it: CTranslate2 would
    otherwise set OpenMP's for the whole process; else the cores). Auto is one batch
    per thread, at most `AUTO_WORKERS` (`cpu_workers`): a small model's batches keep
    one thread each busier than several threads keep one batch (docs/performance.md).
    On a GPU, one batch at a time."""
    if device != "cpu":
        return 1, 0
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else (os.cpu_count() or 1)
    workers = cpu_workers(workers, threads)
    return workers, worker_threads(workers, threads)


def check_format(folder: Path, manifest: dict) -> None:
    """The manifest names this mtkit's export format, or the export is one line: another
    format (an older or newer mtkit's) by its name."""
    found = manifest.get("format")
    if found != FORMAT:
        what = f"export format {found}" if isinstance(found, str) else "no export format"
        raise ExportError(
            f"{folder / MANIFEST}: {what}, which this mtkit does not read (it reads "
            f"{FORMAT}); {AGAIN}"
        )


def check_files(folder: Path, manifest: dict) -> None:
    """Every file that mtkit.json lists, against its size and SHA-256 there: the first
    that is missing or differs is one line naming it."""
    files = manifest.get("files")
    if files is None:
        raise ExportError(f"{folder / MANIFEST}: no list of files (an older mtkit's); {AGAIN}")
    if not isinstance(files, dict) or "model.bin" not in files:
        raise ExportError(f"{folder / MANIFEST}: corrupt (its list of files is damaged); {AGAIN}")
    for name, expected in files.items():
        path = folder / name
        if Path(name).name != name or not isinstance(expected, dict):
            raise ExportError(f"{folder / MANIFEST}: corrupt (bad entry {name[:60]!r}); {AGAIN}")
        if not path.is_file():
            raise ExportError(f"{path}: missing from the export; {AGAIN}")
        size = path.stat().st_size
        if size != expected.get("bytes"):
            raise ExportError(
                f"{path}: {size} bytes, {MANIFEST} says {expected.get('bytes')} "
                f"(truncated or changed since the export); {AGAIN}"
            )
        if file_sha256(path) != expected.get("sha256"):
            raise ExportError(
                f"{path}: its SHA-256 does not match {MANIFEST} (corrupt or "
                f"changed since the export); {AGAIN}"
            )


def ct2_device(ct2, name: str, option: str = "--device") -> str:
    """`auto` -> "cuda" when CTranslate2 sees a CUDA device, else "cpu"; asking for CUDA
    without one is an error naming `option`, as for a checkpoint."""
    if name == "cuda" or (name == "auto" and ct2.get_cuda_device_count() > 0):
        if ct2.get_cuda_device_count() == 0:
            raise OptionError(
                f"{option} cuda, but no CUDA device is available (use {option} auto or cpu)"
            )
        return "cuda"
    return "cpu"

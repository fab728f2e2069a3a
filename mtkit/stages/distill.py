"""`mtkit distill`: a teacher translates the training source; the student learns from it.

Sequence-level knowledge distillation (Kim & Rush, 2016): the teacher (`distill.teacher`)
translates the source side of data.train with beam search, and the run's own model, the
student, trains on those translations. A smaller student learns the teacher's one most
likely output rather than the spread of the references, and comes much closer to it than
when trained on the references alone; with int8 and a lexical shortlist it is how fast
CPU models are made (Bergamot, Firefox translations).

The stage streams and resumes like the others. The source is read and cleaned as
preprocess reads it, `distill.chunk_lines` lines at a time; each chunk's translations go
to RUN/distill/chunks/<n>.jsonl, written atomically, so an interrupted distillation goes
on from the first missing chunk, and a rerun skips finished ones. What a chunk's output
depends on is fixed at the first start and kept in RUN/distill/state.json: the teacher's
fingerprint (its files' SHA-256), the search, and the precision and attention kernel the
teacher runs with (measured once). A different teacher or search starts over. The finished corpus is
RUN/distill/train.<src_lang> and train.<tgt_lang> (plain text, one pair per line), and
RUN/distill/manifest.json, written last, records what was kept and dropped and the
corpus's digest; preprocess then reads that corpus in place of data.train (beside it
with `distill.keep_original`) and records the digest in the training shards' manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from mtkit.core.atomic import atomic_text, remove_leftovers, write_atomic
from mtkit.core.checkpoint import SHORTLIST, trained_model
from mtkit.core.checksum import file_sha256
from mtkit.core.config import Config, CorpusConfig, DataConfig, load_config
from mtkit.core.configcheck import ConfigError
from mtkit.core.errors import UserError
from mtkit.core.languages import tags
from mtkit.core.progress import ProgressLog
from mtkit.core.rundir import run_lock
from mtkit.core.search_options import SearchOptions, Translator
from mtkit.core.vocab import load_vocabs, vocab_paths
from mtkit.data.sources import clean, open_split

log = logging.getLogger(__name__)

FOLDER = "distill"
MANIFEST = "manifest.json"
STATE = "state.json"
FILTERS = ("empty", "cost", "ratio")  # what the teacher's translations are dropped for


class DistillError(UserError, ValueError):
    """An unusable teacher or distillation (one line)."""


@dataclass(frozen=True)
class Teacher:
    """The checkpoint file(s) that translate (several: an ensemble) and their fingerprint."""

    checkpoints: list[Path]
    fingerprint: str


def teacher_configs(cfg: Config) -> list[Path]:
    """The teacher config files (.yaml) named by `distill.teacher`: `mtkit run` runs each
    one's whole chain first."""
    return [Path(t) for t in cfg.distill.teacher if Path(t).suffix in (".yaml", ".yml")]


def resolve_teacher(cfg: Config) -> Teacher:
    """`distill.teacher` as checkpoint files: a file as given, a run directory's (or a
    config's run directory's) final model. Refuses a missing or unfinished teacher."""
    if not cfg.distill.teacher:
        raise ConfigError("distill.teacher is not set: name the teacher's checkpoint or run")
    files = []
    for given in cfg.distill.teacher:
        path = Path(given)
        if path.suffix in (".yaml", ".yml"):
            if not path.is_file():
                raise DistillError(f"distill.teacher: {given}: no such config file")
            files.append(_final_model(load_config(path).run_path, f"mtkit run -c {given}"))
        elif path.is_dir():
            files.append(_final_model(path, "mtkit run"))
        elif path.is_file():
            files.append(path)
        else:
            raise DistillError(
                f"distill.teacher: {given}: no such checkpoint, run directory or config"
            )
    digest = hashlib.sha256("\0".join(file_sha256(f) for f in files).encode()).hexdigest()
    return Teacher(files, digest)


def _final_model(run: Path, how: str) -> Path:
    """A teacher run's final model, once it has one."""
    with run_lock(run, "distill"):
        model = trained_model(run)
    if model is None:
        raise DistillError(f"distill.teacher: {run} has no trained model yet; train it: {how}")
    return model


def settings(cfg: Config, teacher: Teacher) -> dict:
    """What a chunk's translations depend on (precision aside: measured, then stored)."""
    d = cfg.distill
    return {
        "teacher": [str(p) for p in teacher.checkpoints],
        "fingerprint": teacher.fingerprint,
        "beam": d.beam,
        "chunk_lines": d.chunk_lines,
        "asked_precision": d.precision,
        "batch_tokens": cfg.decode.batch_tokens,
    }


def _corpus_settings(cfg: Config) -> dict:
    """What the corpus and shortlist depend on beside the translations: changed, they are
    made again from the chunks, without translating again."""
    d = cfg.distill
    return {
        "max_cost": d.max_cost,
        "max_len_ratio": d.max_len_ratio,
        "shortlist": d.shortlist,
        "shortlist_frequent": d.shortlist_frequent,
    }


def distilled_corpus(cfg: Config) -> tuple[Path, Path]:
    """RUN/distill/train.<src_lang>, train.<tgt_lang>."""
    folder = cfg.run_path / FOLDER
    return folder / f"train.{cfg.data.src_lang}", folder / f"train.{cfg.data.tgt_lang}"


def distilled_manifest(cfg: Config) -> dict | None:
    """The finished distillation's manifest, None when there is none."""
    path = cfg.run_path / FOLDER / MANIFEST
    return json.loads(path.read_text("utf-8")) if path.exists() else None


def is_distilled(cfg: Config, teacher: Teacher) -> bool:
    """Whether RUN/distill holds a finished corpus from this teacher, search and filters."""
    manifest = distilled_manifest(cfg)
    return bool(
        manifest
        and manifest["settings"] == settings(cfg, teacher)
        and manifest["filters"] == _corpus_settings(cfg)
        and all(p.exists() for p in distilled_corpus(cfg))
    )


def training_data(cfg: Config) -> DataConfig:
    """data.train as preprocess reads it: with `distill.teacher`, the distilled corpus
    (and the original pairs after it with `distill.keep_original`)."""
    if not cfg.distill.teacher:
        return cfg.data
    if distilled_manifest(cfg) is None:
        raise DistillError(
            f"distill.teacher is set but {cfg.run_path / FOLDER} holds no finished "
            f"distillation; run `mtkit distill` first (`mtkit run` does)"
        )
    src, tgt = distilled_corpus(cfg)
    distilled = (CorpusConfig(src=str(src), tgt=str(tgt)),)
    return dataclasses.replace(
        cfg.data, train=distilled + (cfg.data.train if cfg.distill.keep_original else ())
    )


def distill(cfg: Config, teacher: Teacher | None = None) -> dict:
    """The `mtkit distill` stage: translate data.train's source with the teacher, chunk by
    chunk (skipping chunks already done), then write the filtered corpus and its
    manifest. Returns the manifest. `teacher`: `resolve_teacher(cfg)` when the caller has
    it already (None: resolved here)."""
    if tags(cfg.data):
        raise DistillError(
            "distill: a multilingual run (several target languages) is not supported; "
            "distil each direction in a run of its own"
        )
    run = cfg.run_path
    if not vocab_paths(run, cfg.tokenizer.joint)[1].exists():
        raise DistillError(
            f"{run} has no tokenizer yet: run `mtkit tokenizer` first (with tokenizer.from "
            f"naming the teacher, the student shares its pieces)"
        )
    teacher = teacher or resolve_teacher(cfg)  # (given: resolved, and hashed, already)
    with run_lock(run, "distill"):
        return _distill(cfg, teacher)


def _distill(cfg: Config, teacher: Teacher) -> dict:
    from mtkit.engines.loader import load_engine  # torch: only when translating

    folder = cfg.run_path / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    chunks = folder / "chunks"
    for leftovers in (folder, chunks):  # of atomic writes a kill cut short
        remove_leftovers(leftovers, ("*",))
    state = _start(cfg, teacher, folder, chunks)
    engine = load_engine(
        teacher.checkpoints, cfg.train.device, "train.device", state["precision"] or "auto"
    )
    # The measured choices (precision under auto, the attention kernel) are made at the
    # first start and kept, so that a resumed distillation translates as it began.
    if state["precision"] is None or state.get("attention") is None:
        state["precision"] = engine.precision["precision"]
        state["attention"] = engine.precision["attention"]["kernel"]
        write_atomic(folder / STATE, (json.dumps(state, indent=2) + "\n").encode())
    engine.use_attention(state["attention"])
    _check_vocabularies(cfg, engine, teacher)
    opts = dataclasses.replace(
        SearchOptions.from_config(engine.config.decode), beam=cfg.distill.beam, nbest=1
    )
    corpora = open_split(cfg.data, "train", cfg.run_path / "cache")
    try:
        translated, index, seconds = _translate_chunks(cfg, engine, opts, corpora, chunks)
    finally:
        engine.close()  # its helper processes: not kept through the student's training
    if translated:
        log.info(
            "distill: the teacher translated %d sentences in %.0f s (%.1f sentences/s)",
            translated,
            seconds,
            translated / max(seconds, 1e-9),
        )
    return _write_corpus(cfg, teacher, state, chunks, index)


def _translate_chunks(
    cfg: Config, engine: Translator, opts: SearchOptions, corpora: list, chunks: Path
) -> tuple[int, int, float]:
    """The teacher's translations of every chunk not yet translated, each chunk a file
    of its own (written atomically); returns the sentences translated now, the chunks
    in all, and the seconds it took."""
    progress = ProgressLog(sum(c.size for c in corpora), stage="distill")
    start, translated, index = time.perf_counter(), 0, 0
    for corpus in corpora:
        for raw_src, raw_tgt in corpus.chunks(cfg.distill.chunk_lines):
            path = chunks / f"{index:06d}.jsonl"
            index += 1
            if not path.exists():
                src, _, keep = clean(raw_src, raw_tgt)
                lines = [x for x, k in zip(src, keep, strict=True) if k]
                hyps = engine.translate(lines, opts, batch_tokens=engine.batch_tokens)
                pieces = engine.encode(lines)
                with atomic_text(path) as f:
                    for line, ids, (best,) in zip(lines, pieces, hyps, strict=True):
                        record = {
                            "src": line,
                            "tgt": engine.tgt_vocab.decode(best.tokens),
                            "src_pieces": len(ids),
                            "tgt_pieces": len(best.tokens),
                            "cost": round(-best.log_prob / (len(best.tokens) + 1), 4),
                        }
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
                translated += len(lines)
            progress.advance(len(raw_src))
    return translated, index, time.perf_counter() - start


def _start(cfg: Config, teacher: Teacher, folder: Path, chunks: Path) -> dict:
    """RUN/distill/state.json: the settings, kept from the first start; a teacher or a
    search that differs from the stored one starts the distillation over."""
    wanted = settings(cfg, teacher)
    path = folder / STATE
    if path.exists():
        state = json.loads(path.read_text("utf-8"))
        if state["settings"] == wanted:
            return state
        changed = sorted(k for k in wanted if state["settings"].get(k) != wanted[k])
        log.warning(
            "distill: %s changed since the chunks in %s were translated: starting over",
            ", ".join(changed),
            chunks,
        )
    shutil.rmtree(chunks, ignore_errors=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    chunks.mkdir()
    asked = cfg.distill.precision
    state = {"settings": wanted, "precision": None if asked == "auto" else asked, "attention": None}
    write_atomic(path, (json.dumps(state, indent=2) + "\n").encode())
    return state


def _check_vocabularies(cfg: Config, engine, teacher: Teacher) -> None:
    """The student must share the teacher's pieces: its corpus is the teacher's text,
    and its shortlist and tokenizer are the teacher's."""
    src, tgt = load_vocabs(cfg.run_path, cfg.tokenizer.joint)
    if not (src.same(engine.src_vocab) and tgt.same(engine.tgt_vocab)):
        raise DistillError(
            f"distill.teacher {teacher.checkpoints[0]}: its tokenizer differs from this "
            f"run's ({cfg.run_path}/spm.*); set tokenizer.from to the teacher's checkpoint "
            f"and rerun `mtkit tokenizer`"
        )


def _write_corpus(cfg: Config, teacher: Teacher, state: dict, chunks: Path, count: int) -> dict:
    """Filter the chunks' pairs into RUN/distill/train.* and write the manifest last."""
    d = cfg.distill
    dropped = dict.fromkeys(FILTERS, 0)
    kept = read = 0
    digest = hashlib.sha256()
    src_path, tgt_path = distilled_corpus(cfg)
    with atomic_text(src_path) as src_out, atomic_text(tgt_path) as tgt_out:
        for index in range(count):
            with open(chunks / f"{index:06d}.jsonl", encoding="utf-8") as f:
                for line in f:
                    pair = json.loads(line)
                    read += 1
                    reason = _dropped_for(pair, d.max_cost, d.max_len_ratio)
                    if reason:
                        dropped[reason] += 1
                        continue
                    kept += 1
                    src_out.write(pair["src"] + "\n")
                    tgt_out.write(pair["tgt"] + "\n")
                    digest.update(f"{pair['src']}\t{pair['tgt']}\n".encode())
    if not kept:
        raise DistillError(
            f"distill: no pairs left of {read} translated (dropped: {dropped}); "
            f"loosen distill.max_cost or distill.max_len_ratio"
        )
    shortlist = cfg.run_path / SHORTLIST
    shortlist.unlink(missing_ok=True)
    if d.shortlist:
        _write_shortlist(cfg, src_path, tgt_path, shortlist)
    manifest = {
        "settings": state["settings"],
        "precision": state["precision"],
        "filters": _corpus_settings(cfg),
        "chunks": count,
        "pairs": {"translated": read, "kept": kept, "dropped": dropped},
        "corpus_sha256": digest.hexdigest(),
    }
    write_atomic(cfg.run_path / FOLDER / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    log.info("distill: kept %d of %d translated pairs; dropped %s", kept, read, dropped)
    return manifest


def _write_shortlist(cfg: Config, src_path: Path, tgt_path: Path, out: Path) -> None:
    """The lexical shortlist of the distilled corpus (`mtkit.search.shortlist`)."""
    import numpy as np

    from mtkit.core.checkpoint import save_tensors
    from mtkit.search.shortlist import build_shortlist

    src_vocab, tgt_vocab = load_vocabs(cfg.run_path, cfg.tokenizer.joint)
    sources = src_path.read_text("utf-8").splitlines()
    targets = tgt_path.read_text("utf-8").splitlines()
    shortlist = build_shortlist(
        [np.asarray(ids) for ids in src_vocab.encode(sources)],
        [np.asarray(ids) for ids in tgt_vocab.encode(targets)],
        len(src_vocab),
        len(tgt_vocab),
        cfg.distill.shortlist,
        cfg.distill.shortlist_frequent,
    )
    save_tensors({k: v.int() for k, v in shortlist.as_entry().items()}, out)
    log.info(
        "distill: a shortlist of %d target pieces per source piece and %d frequent ones",
        shortlist.table.size(1),
        shortlist.frequent.numel(),
    )


def _dropped_for(pair: dict, max_cost: float, max_len_ratio: float) -> str | None:
    """Why a distilled pair is dropped (a `FILTERS` name), or None to keep it."""
    if not pair["tgt"].strip():
        return "empty"
    if max_cost and pair["cost"] > max_cost:
        return "cost"
    if max_len_ratio:
        s, t = max(pair["src_pieces"], 1), max(pair["tgt_pieces"], 1)
        if max(s, t) > max_len_ratio * min(s, t):
            return "ratio"
    return None

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
fingerprint (its files' SHA-256), the search, the precision and attention kernel the
teacher runs with (measured once), and the source corpus's identity (`corpus_identity`:
the data settings that select data.train and its files' SHA-256). A different teacher or
search starts over; a different corpus keeps the chunks whose source lines are the
same and translates the others again (each chunk is compared with the new corpus's
lines, and the identity is recorded once every chunk matches). The teacher is loaded
and checked (readable, the student's vocabularies) and the corpus opened before any
chunk of an earlier distillation is removed, so a refused teacher leaves a finished
distillation as it was. A chunk file found damaged is translated again; a state.json
or manifest.json that cannot be read, or that lacks a key this mtkit writes, is one line
naming it (and the key) and what to do.

The finished corpus is RUN/distill/train.<src_lang> and train.<tgt_lang> (plain text,
one pair per line), and RUN/distill/manifest.json, written last, records what was kept
and dropped, the settings (corpus identity included: `mtkit run` distils again when
data.train changed) and the corpus's digest; preprocess then reads that corpus in place
of data.train (beside it with `distill.keep_original`) and records the digest in the
training shards' manifest. With `distill.shortlist`, RUN/distill/shortlist.pt (written
atomically) holds the lexical shortlist of the distilled corpus with the vocabulary
sizes it was made for; training checks it at its start and keeps it in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from mtkit.core.atomic import atomic_text, remove_leftovers, write_atomic
from mtkit.core.checkpoint import SHORTLIST, VOCAB_SIZES, trained_model
from mtkit.core.checksum import file_sha256
from mtkit.core.config import Config, CorpusConfig, DataConfig, load_config
from mtkit.core.configcheck import ConfigError
from mtkit.core.errors import UserError
from mtkit.core.languages import tags
from mtkit.core.progress import ProgressLog
from mtkit.core.rundir import run_lock
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import load_vocabs, vocab_paths
from mtkit.data.sources import clean, open_split
from mtkit.engines.base import Engine

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
        "corpus": corpus_identity(cfg.data),
    }


def corpus_identity(data: DataConfig) -> str:
    """What the teacher translates, as one SHA-256: the settings that select data.train
    (each corpus's files or dataset, split, columns and languages, and the run's
    languages) and the SHA-256 of each local file it reads, both sides (a pair with an
    empty target is not translated). A hub dataset named by the hub counts by its name,
    config and split only."""
    h = hashlib.sha256(f"{data.src_lang}\0{data.tgt_lang}\0".encode())
    for corpus in data.corpora("train"):
        chosen = dataclasses.asdict(corpus)
        chosen.pop("weight")  # repeats pairs for training; each is translated once
        h.update(json.dumps(chosen, sort_keys=True).encode())
        for path in (Path(p) for p in (corpus.src, corpus.tgt, corpus.path, corpus.hub) if p):
            files = [path] if path.is_file() else []
            if path.is_dir():  # a local dataset folder
                files = sorted(p for p in path.rglob("*") if p.is_file())
            for file in files:
                h.update(f"\0{file}\0{_file_digest(file)}".encode())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    """A file's SHA-256, hashed once per process while its size and time stay the same
    (`mtkit run` asks twice: is the corpus distilled, then distil it)."""
    stat = path.stat()
    return _digest_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


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
    """The finished distillation's manifest, None when there is none; one line when it
    cannot be read."""
    path = cfg.run_path / FOLDER / MANIFEST
    if not path.exists():
        return None
    return _read_record(
        path,
        {"settings": dict, "filters": dict, "corpus_sha256": str},
        "rerun `mtkit distill` to write it again (its translated chunks are kept)",
    )


def _read_record(path: Path, keys: dict[str, type], remedy: str) -> dict:
    """A bookkeeping file of RUN/distill (JSON) with `keys` of their types, or a
    `DistillError` naming it, the first key it lacks if that is what is wrong, and
    `remedy` (what to do)."""
    try:
        record = json.loads(path.read_bytes())
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a nesting bomb
        record = None
    if isinstance(record, dict):
        _check_keys(path, record, keys, remedy)
    if not isinstance(record, dict) or not all(isinstance(record[k], t) for k, t in keys.items()):
        raise DistillError(f"{path}: unreadable (truncated or damaged); {remedy}")
    return record


def _check_keys(
    path: Path, record: dict, keys: Iterable[str], remedy: str, within: str = ""
) -> None:
    """A `DistillError` naming the first of `keys` that `record` (the part `within` of
    the file at `path`, such as "settings.") lacks: a file this mtkit writes has them all."""
    missing = [k for k in keys if k not in record]
    if missing:
        raise DistillError(f"{path}: incomplete (no {within}{missing[0]}); {remedy}")


def is_distilled(cfg: Config, teacher: Teacher) -> bool:
    """Whether RUN/distill holds a finished corpus (and its shortlist) from this teacher,
    search, source corpus and filters (a manifest that cannot be read: no, it is written
    again)."""
    try:
        manifest = distilled_manifest(cfg)
    except DistillError as e:
        log.warning("%s", e)
        return False
    return bool(
        manifest
        and manifest["settings"] == settings(cfg, teacher)
        and manifest["filters"] == _corpus_settings(cfg)
        and all(p.exists() for p in distilled_corpus(cfg))
        and (not cfg.distill.shortlist or (cfg.run_path / SHORTLIST).is_file())
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
    with joined_ranks(cfg) as ranks:
        if teacher is None:  # (given: resolved, and hashed, already)
            teacher = ranks.first_says(resolve_teacher(cfg) if ranks.main else None)
        with run_lock(run, "distill") if ranks.main else nullcontext():
            manifest = _distill(cfg, teacher, ranks)
        ranks.barrier()  # (the manifest is written)
    return manifest if ranks.main else distilled_manifest(cfg)


def joined_ranks(cfg: Config):
    """This process's place among the ranks of a torchrun job, alone rank 0 of 1, the
    process group started on the teacher's device (`mtkit.engines.ranks.Ranks.joined`,
    a context manager)."""
    from mtkit.core.device import resolve_device
    from mtkit.engines.ranks import Ranks

    return Ranks.joined(resolve_device(cfg.train.device, "train.device"))


def _distill(cfg: Config, teacher: Teacher, ranks) -> dict | None:
    """The distillation (`distill`); under torchrun, every rank translates its share of
    each chunk (`mtkit.engines.ranks`) and rank 0 keeps the books (RUN/distill's state,
    the chunks' checks, the corpus and its manifest, which it returns; None elsewhere)."""
    folder = cfg.run_path / FOLDER
    chunks = folder / "chunks"
    wanted = settings(cfg, teacher)
    engine = None
    try:
        if ranks.main:
            engine, corpora, state, stored = _start_main(cfg, teacher, folder, chunks, wanted)
        # The other ranks load the teacher as rank 0 chose to run it (measured once)
        state = ranks.first_says(state if ranks.main else None)
        if not ranks.main:
            engine = _load_teacher(teacher, cfg, state["precision"])
            corpora = open_split(cfg.data, "train", cfg.run_path / "cache")
        engine.use_attention(state["attention"])
        opts = dataclasses.replace(
            SearchOptions.from_config(engine.config.decode), beam=cfg.distill.beam, nbest=1
        )
        compare = ranks.main and state["settings"] != wanted  # the corpus changed: check each
        translated = seconds = 0
        for attempt in (1, 2):
            now, count, took = _translate_chunks(
                cfg, engine, opts, corpora, chunks, compare, ranks, _part_options(state)
            )
            translated, seconds = translated + now, seconds + took
            pairs = None
            if ranks.main:
                if compare:  # every chunk now holds this corpus's lines
                    state["settings"], compare = wanted, False
                    _write_state(folder, state)
                pairs = _pairs_or_damaged(cfg, chunks, count, attempt)
            if not ranks.first_says(ranks.main and pairs is None):  # (damaged: again)
                break
    finally:
        if engine is not None:
            engine.close()  # its helper processes: not kept through the student's training
    if translated:
        log.info(
            "distill: the teacher translated %d sentences in %.0f s (%.1f sentences/s)",
            translated,
            seconds,
            translated / max(seconds, 1e-9),
        )
    return _write_manifest(cfg, state, count, pairs) if ranks.main else None


def _load_teacher(teacher: Teacher, cfg: Config, precision: str):
    from mtkit.engines.loader import load_engine  # torch: only when translating

    return load_engine(teacher.checkpoints, cfg.train.device, "train.device", precision)


def _start_main(cfg: Config, teacher: Teacher, folder: Path, chunks: Path, wanted: dict):
    """Rank 0's (or one process's) start: the teacher loaded and checked, the corpus
    opened, RUN/distill's state kept or started over (`_start`) with the measured
    choices; returns the engine, the corpora, the state and the stored one."""
    folder.mkdir(parents=True, exist_ok=True)
    for leftovers in (folder, chunks):  # of atomic writes a kill cut short
        remove_leftovers(leftovers, ("*",))
    stored = _stored_state(folder / STATE, wanted)
    resumed = stored if stored and _changed(stored["settings"], wanted) <= {"corpus"} else None
    # The teacher is loaded and checked, and the corpus opened, before anything an
    # earlier distillation made is removed: a refused teacher deletes nothing.
    engine = _load_teacher(
        teacher, cfg, (resumed and resumed["precision"]) or cfg.distill.precision
    )
    try:
        _check_vocabularies(cfg, engine, teacher)
        corpora = open_split(cfg.data, "train", cfg.run_path / "cache")
        state = _start(cfg, wanted, stored, resumed, folder, chunks)
    except BaseException:
        engine.close()
        raise
    # The measured choices (precision under auto, the attention kernel) are made at
    # the first start and kept, so that a resumed distillation translates as it began.
    if state["precision"] is None or state["attention"] is None:
        state["precision"] = engine.precision["precision"]
        state["attention"] = engine.precision["attention"]["kernel"]
        _write_state(folder, state)
    return engine, corpora, state, stored


def _part_options(state: dict) -> str:
    """What a rank's part of a chunk depends on beside the chunk's lines
    (`mtkit.engines.ranks.options_digest`): the settings and the measured choices."""
    from mtkit.engines.ranks import options_digest

    return options_digest({k: state[k] for k in ("settings", "precision", "attention")})


def _pairs_or_damaged(cfg: Config, chunks: Path, count: int, attempt: int) -> _Pairs | None:
    """The filtered corpus written from the chunks (`_write_pairs`), after removing those
    of a longer corpus; None where some chunk files were damaged (removed: translated
    again on the next turn), one line when that happens again (`attempt` 2)."""
    _remove_chunks_from(chunks, count)
    try:
        return _write_pairs(cfg, chunks, count)
    except _DamagedChunks as e:
        if attempt == 2:
            raise DistillError(
                f"{e.paths[0]}: unreadable again right after it was written; "
                f"check the disk of {chunks}"
            ) from None
        for path in e.paths:  # translated again on the next turn
            log.warning(
                "distill: %s is damaged (cut short or not JSON lines): translating its lines again",
                path,
            )
            path.unlink()
        return None


def _changed(stored: dict, wanted: dict) -> set[str]:
    """The settings that differ between a stored state's and the wanted ones."""
    return {k for k in wanted if stored[k] != wanted[k]}


def _stored_state(path: Path, wanted: dict) -> dict | None:
    """RUN/distill/state.json, None when there is none; one line when it cannot be read or
    lacks a key this mtkit writes (`wanted`: the settings it writes). Its precision and
    attention kernel are None until the first start has measured them."""
    if not path.exists():
        return None
    maybe = (str, type(None))
    remedy = (
        f"delete it to distil again from the start (the chunks in {path.parent / 'chunks'} "
        f"are then translated again)"
    )
    state = _read_record(path, {"settings": dict, "precision": maybe, "attention": maybe}, remedy)
    _check_keys(path, state["settings"], wanted, remedy, within="settings.")
    return state


def _write_state(folder: Path, state: dict) -> None:
    write_atomic(folder / STATE, (json.dumps(state, indent=2) + "\n").encode())


def _translate_chunks(
    cfg: Config,
    engine: Engine,
    opts: SearchOptions,
    corpora: list,
    chunks: Path,
    compare: bool,
    ranks,
    options: str,
) -> tuple[int, int, float]:
    """The teacher's translations of every chunk not yet translated, each chunk a file
    of its own (written atomically); returns the sentences translated now (by this
    rank), the chunks in all, and the seconds it took. `compare`: a chunk file is kept
    only where its source lines are the corpus's (data.train changed since it was
    written), else translated again. Under torchrun (`ranks`) rank 0 checks the chunk
    files and says which are to translate; each rank translates its share of such a
    chunk into its part, kept where an earlier run finished it (`options`: what a part
    depends on), and rank 0 puts the parts together (`mtkit.engines.ranks`)."""
    progress = ProgressLog(sum(c.size for c in corpora), stage="distill")
    start, translated, index = time.perf_counter(), 0, 0
    for corpus in corpora:
        for raw_src, raw_tgt in corpus.chunks(cfg.distill.chunk_lines):
            path = chunks / f"{index:06d}.jsonl"
            index += 1
            lines = None
            if not ranks.main:
                pass  # (rank 0 checks the chunk files)
            elif compare and path.exists():
                src, _, keep = clean(raw_src, raw_tgt)
                lines = [x for x, k in zip(src, keep, strict=True) if k]
                if _chunk_sources(path) != lines:
                    path.unlink()  # another corpus's lines (or a damaged file)
            elif path.exists() and not _whole(path, raw_src, raw_tgt):
                log.warning("distill: %s is damaged (cut short): translating its lines again", path)
                path.unlink()
            if ranks.first_says(not path.exists()):
                if lines is None:
                    src, _, keep = clean(raw_src, raw_tgt)
                    lines = [x for x, k in zip(src, keep, strict=True) if k]
                if ranks.world == 1:
                    with atomic_text(path) as f:
                        _write_records(engine, opts, lines, f)
                    translated += len(lines)
                else:
                    translated += _translate_share(engine, opts, lines, path, ranks, options)
            if ranks.main:
                progress.advance(len(raw_src))
    return translated, index, time.perf_counter() - start


def _write_records(
    engine: Engine,
    opts: SearchOptions,
    lines: list[str],
    f,
    done: Callable[[int], None] | None = None,
) -> None:
    """The teacher's translation of each line, one JSON record a line (`RECORD`), to the
    text file `f`; `done(n)` told as lines are translated."""
    hyps = engine.translate(lines, opts, done, batch_tokens=engine.batch_tokens)
    pieces = engine.encode(lines)
    for line, ids, (best,) in zip(lines, pieces, hyps, strict=True):
        record = {
            "src": line,
            "tgt": engine.tgt_vocab.decode(best.tokens),
            "src_pieces": len(ids),
            "tgt_pieces": len(best.tokens),
            "cost": round(-best.log_prob / (len(best.tokens) + 1), 4),
        }
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _translate_share(
    engine: Engine, opts: SearchOptions, lines: list[str], path: Path, ranks, options: str
) -> int:
    """This rank's share of a chunk's `lines` translated into its part of the chunk file
    `path` (kept where finished), the parts put together by rank 0; returns the lines
    this rank translated now."""
    from mtkit.engines.ranks import RankPart, scan_texts, translated

    part = RankPart(ranks, path, scan_texts(lines, ranks.world), options)

    def write(share, sink) -> None:
        mine = lines[share.first : share.end]
        _write_records(engine, opts, mine, sink, translated(ranks, path))

    return 0 if part.translate(write) else part.share.lines


RECORD = {"src": str, "tgt": str, "src_pieces": int, "tgt_pieces": int, "cost": (int, float)}


def _read_chunk(path: Path) -> list[dict] | None:
    """A chunk file's records, None when it is damaged (cut short, not UTF-8 JSON lines
    of `RECORD`'s fields). Lines end at a newline only: a translation may hold U+2028."""
    try:
        text = path.read_text("utf-8")
        if text and not text.endswith("\n"):
            return None
        records = [json.loads(line) for line in text.split("\n")[:-1]]
    except (ValueError, RecursionError):
        return None
    fine = all(
        isinstance(r, dict) and all(isinstance(r.get(k), t) for k, t in RECORD.items())
        for r in records
    )
    return records if fine else None


def _whole(path: Path, raw_src: list[str], raw_tgt: list[str]) -> bool:
    """Whether a chunk file holds a line for each pair of its chunk that cleaning keeps
    (both sides not blank), the last one ended: a cheap check, without parsing it."""
    data = path.read_bytes()
    pairs = sum(1 for s, t in zip(raw_src, raw_tgt, strict=True) if s.strip() and t.strip())
    return data.count(b"\n") == pairs and (not data or data.endswith(b"\n"))


def _chunk_sources(path: Path) -> list[str] | None:
    """The source lines a chunk file translated, None when it is damaged."""
    records = _read_chunk(path)
    return None if records is None else [r["src"] for r in records]


def _remove_chunks_from(chunks: Path, count: int) -> None:
    """Chunk files numbered `count` and beyond: of a longer corpus than this one."""
    for path in chunks.glob("*.jsonl"):
        if path.stem.isdigit() and int(path.stem) >= count:
            path.unlink()


def _start(
    cfg: Config, wanted: dict, stored: dict | None, resumed: dict | None, folder: Path, chunks: Path
) -> dict:
    """RUN/distill/state.json: the settings, kept from the first start. `resumed`: the
    `stored` state, when at most the corpus differs from the `wanted` settings (its
    chunks are then compared with the new corpus's lines, and kept where they match). A
    teacher or a search that differs from the stored one starts the distillation over."""
    if resumed is not None:
        if resumed["settings"] != wanted:
            log.warning(
                "distill: data.train changed since the chunks in %s were translated: "
                "translating again those whose source lines differ",
                chunks,
            )
            (folder / MANIFEST).unlink(missing_ok=True)
        chunks.mkdir(exist_ok=True)
        return resumed
    if stored is not None:
        log.warning(
            "distill: %s changed since the chunks in %s were translated: starting over",
            ", ".join(sorted(_changed(stored["settings"], wanted))),
            chunks,
        )
    shutil.rmtree(chunks, ignore_errors=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    chunks.mkdir()
    asked = cfg.distill.precision
    state = {"settings": wanted, "precision": None if asked == "auto" else asked, "attention": None}
    _write_state(folder, state)
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


class _DamagedChunks(Exception):
    """Chunk files found damaged while the corpus was written (`paths`)."""

    def __init__(self, paths: list[Path]):
        super().__init__(", ".join(map(str, paths)))
        self.paths = paths


@dataclass(frozen=True)
class _Pairs:
    """What `_write_pairs` counted: pairs read from the chunks, kept, dropped (by
    reason), and the SHA-256 of the kept ones."""

    read: int
    kept: int
    dropped: dict[str, int]
    sha256: str


def _write_pairs(cfg: Config, chunks: Path, count: int) -> _Pairs:
    """Filter the chunks' pairs into RUN/distill/train.*; `_DamagedChunks` (nothing
    written) when some chunk files cannot be read."""
    d = cfg.distill
    dropped = dict.fromkeys(FILTERS, 0)
    kept = read = 0
    digest = hashlib.sha256()
    damaged = []
    src_path, tgt_path = distilled_corpus(cfg)
    with atomic_text(src_path) as src_out, atomic_text(tgt_path) as tgt_out:
        for index in range(count):
            path = chunks / f"{index:06d}.jsonl"
            records = _read_chunk(path)
            if records is None:
                damaged.append(path)
                continue
            for pair in records:
                read += 1
                reason = _dropped_for(pair, d.max_cost, d.max_len_ratio)
                if reason:
                    dropped[reason] += 1
                    continue
                kept += 1
                src_out.write(pair["src"] + "\n")
                tgt_out.write(pair["tgt"] + "\n")
                digest.update(f"{pair['src']}\t{pair['tgt']}\n".encode())
        if damaged:  # raised inside: the files begun are not renamed into place
            raise _DamagedChunks(damaged)
    return _Pairs(read, kept, dropped, digest.hexdigest())


def _write_manifest(cfg: Config, state: dict, count: int, pairs: _Pairs) -> dict:
    """The shortlist of the corpus written (`distill.shortlist`), then the manifest, last."""
    if not pairs.kept:
        raise DistillError(
            f"distill: no pairs left of {pairs.read} translated (dropped: {pairs.dropped}); "
            f"loosen distill.max_cost or distill.max_len_ratio"
        )
    shortlist = cfg.run_path / SHORTLIST
    if cfg.distill.shortlist:
        _write_shortlist(cfg, *distilled_corpus(cfg), shortlist)  # atomically, over the old
    else:
        shortlist.unlink(missing_ok=True)
    manifest = {
        "settings": state["settings"],
        "precision": state["precision"],
        "filters": _corpus_settings(cfg),
        "chunks": count,
        "pairs": {"translated": pairs.read, "kept": pairs.kept, "dropped": pairs.dropped},
        "corpus_sha256": pairs.sha256,
    }
    write_atomic(cfg.run_path / FOLDER / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    log.info(
        "distill: kept %d of %d translated pairs; dropped %s",
        pairs.kept,
        pairs.read,
        pairs.dropped,
    )
    return manifest


def _write_shortlist(cfg: Config, src_path: Path, tgt_path: Path, out: Path) -> None:
    """The lexical shortlist of the distilled corpus (`mtkit.search.shortlist`), with the
    vocabulary sizes it was made for (`checkpoint.check_shortlist`), written atomically."""
    import numpy as np
    import torch

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
    entry = {k: v.int() for k, v in shortlist.as_entry().items()}
    entry[VOCAB_SIZES] = torch.tensor([len(src_vocab), len(tgt_vocab)], dtype=torch.int64)
    save_tensors(entry, out)
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

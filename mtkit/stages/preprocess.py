"""`mtkit preprocess`: encode every split once with SentencePiece into binarized shards.

Preprocessing streams: each corpus is read in chunks (`mtkit.data.sources`), cleaned and
encoded (in worker processes for large inputs), filtered, and appended to the shard's
files (`mtkit.data.shards.ShardWriter`, which also describes the format), so memory stays
flat whatever the corpus size. Exact duplicates are found by 8-byte pair hashes.
`RUN/data` is written to a temporary folder and renamed into place, so an interrupted run
leaves no partial data. `verify_shards` (`mtkit preprocess --verify`) checks the shards
without writing anything.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import chain

import numpy as np

from mtkit.core import languages
from mtkit.core.atomic import atomic_dir, remove_leftovers
from mtkit.core.config import Config, DataConfig, save_config
from mtkit.core.errors import UserError
from mtkit.core.langid import in_language
from mtkit.core.languages import direction, name, shares
from mtkit.core.progress import ProgressLog
from mtkit.core.rundir import run_lock
from mtkit.core.signals import held_while_starting_workers, ignore_in_worker
from mtkit.core.vocab import Vocab, load_vocabs
from mtkit.data.alignments import align_shard
from mtkit.data.shards import (
    RERUN,
    SPLITS,
    Encoded,
    ShardDataset,
    ShardWriter,
    ids_dtype,
    tokenizer_digests,
)
from mtkit.data.sources import (
    CHUNK_PAIRS,
    Chunk,
    Corpus,
    DataError,
    SeenHashes,
    clean,
    open_split,
    pair_hashes,
)
from mtkit.stages.distill import distilled_manifest, training_data

log = logging.getLogger(__name__)


class WordCache:
    """SentencePiece encoding through a cache of each word's pieces: exact, and several
    times faster on real text, where most words repeat.

    With mtkit's models (whitespace-split pieces, a dummy prefix), a sentence's pieces are
    its words' pieces one after the other: no piece spans a space, so each word is
    segmented on its own. That holds once SentencePiece's normalization leaves the text
    as it is, so only sentences that are printable and NFKC-normalized go word by word;
    the others are encoded whole. Every chunk also encodes a few sentences both ways, and
    a difference turns the cache off for good (logged)."""

    CHECKS = 16  # sentences per chunk encoded both ways
    MAX_WORDS = 1 << 17  # cache entries; the cache starts over beyond (bounds memory)

    def __init__(self, vocab: Vocab, dtype: np.dtype):
        self.vocab = vocab
        self.dtype = dtype
        self.exact = True
        self._clear()

    def _clear(self) -> None:
        self._index: dict[str, int] = {}  # word -> its row in the tables below
        self._starts = np.zeros(0, dtype=np.int64)  # where each word's pieces start
        self._lengths = np.zeros(0, dtype=np.int64)
        self._pieces = np.zeros(0, dtype=self.dtype)  # all cached words' pieces

    def _flat(self, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=int(lengths.sum()))
        return lengths, flat

    def _add(self, words: list[str]) -> None:
        lengths, flat = self._flat(self.vocab.encode(words))
        self._index.update(
            zip(words, range(len(self._index), len(self._index) + len(words)), strict=True)
        )
        self._starts = np.concatenate(
            (self._starts, len(self._pieces) + np.cumsum(lengths) - lengths)
        )
        self._lengths = np.concatenate((self._lengths, lengths))
        self._pieces = np.concatenate((self._pieces, flat))

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Cleaned sentences -> (lengths int32, concatenated ids)."""
        safe = [x.isprintable() and unicodedata.is_normalized("NFKC", x) for x in sentences]
        if not (self.exact and sentences and all(safe)):
            if not self.exact or not any(safe):
                return self._flat(self.vocab.encode(sentences))
            pieces = self._word_pieces([x for x, ok in zip(sentences, safe, strict=True) if ok])
            whole = iter(
                self.vocab.encode([x for x, ok in zip(sentences, safe, strict=True) if not ok])
            )
            return self._flat([next(pieces) if ok else next(whole) for ok in safe])
        words = " ".join(sentences).split(" ")
        missing = list(set(words).difference(self._index))
        if len(self._index) + len(missing) > self.MAX_WORDS:
            self._clear()
            missing = list(set(words))
        if missing:
            self._add(missing)
        rows = np.fromiter(map(self._index.__getitem__, words), dtype=np.int64, count=len(words))
        word_lengths = self._lengths[rows]
        ends = np.cumsum(word_lengths)
        # the pieces of every word in turn: each word's start, counted up along its length
        flat = self._pieces[
            np.repeat(self._starts[rows] - ends + word_lengths, word_lengths)
            + np.arange(ends[-1] if len(ends) else 0)
        ]
        counts = np.fromiter(
            (x.count(" ") + 1 for x in sentences), dtype=np.int64, count=len(sentences)
        )
        lengths = np.add.reduceat(word_lengths, np.cumsum(counts) - counts).astype(np.int32)
        if not self._agrees(sentences, lengths, flat):
            return self._flat(self.vocab.encode(sentences))
        return lengths, flat

    def _word_pieces(self, sentences: list[str]) -> Iterator[list[int]]:
        lengths, flat = self.encode(sentences)
        ends = np.cumsum(lengths)
        return (flat[e - n : e].tolist() for n, e in zip(lengths, ends, strict=True))

    def _agrees(self, sentences: list[str], lengths: np.ndarray, flat: np.ndarray) -> bool:
        """Encode a spread of the sentences whole and compare; turn the cache off if any
        differs."""
        picks = range(0, len(sentences), max(len(sentences) // self.CHECKS, 1))
        ends = np.cumsum(lengths)
        whole = self.vocab.encode([sentences[i] for i in picks])
        for i, ids in zip(picks, whole, strict=True):
            if flat[ends[i] - lengths[i] : ends[i]].tolist() != ids:
                log.warning(
                    "word-by-word encoding differs from SentencePiece's on %r; "
                    "encoding whole sentences from here on",
                    sentences[i][:80],
                )
                self.exact = False
                return False
        return True


class _Encoder:
    """Cleans and encodes chunks; lives in each worker process (built there once)."""

    def __init__(
        self, src: tuple[bytes, list[str] | None], tgt: tuple[bytes, list[str] | None], dtype: str
    ):
        src_vocab = Vocab(*src)
        tgt_vocab = src_vocab if tgt == src else Vocab(*tgt)
        self.src = WordCache(src_vocab, np.dtype(dtype))
        self.tgt = self.src if tgt_vocab is src_vocab else WordCache(tgt_vocab, np.dtype(dtype))

    def __call__(self, chunk: Chunk, hashes: bool, texts: bool) -> Encoded:
        src, tgt, keep = clean(*chunk)
        if not keep.all():
            src = [x for x, k in zip(src, keep, strict=True) if k]
            tgt = [x for x, k in zip(tgt, keep, strict=True) if k]
        src_lengths, src_ids = self.src.encode(src)
        tgt_lengths, tgt_ids = self.tgt.encode(tgt)
        return Encoded(
            int((~keep).sum()),
            src_lengths,
            tgt_lengths,
            src_ids,
            tgt_ids,
            pair_hashes(src, tgt) if hashes else None,
            (src, tgt) if texts else None,
        )


_worker_encoder: _Encoder | None = None  # one per worker process


def _start_worker(*args) -> None:
    global _worker_encoder
    ignore_in_worker()  # Ctrl-C and SIGTERM to the group are the main process's to handle
    _exit_when_orphaned()
    _worker_encoder = _Encoder(*args)


def _exit_when_orphaned() -> None:
    """A worker that ignores stop signals ends itself once its parent is gone (killed with
    SIGKILL, say), rather than wait forever for work no one will send."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _encode_in_worker(chunk: Chunk, hashes: bool, texts: bool) -> Encoded:
    return _worker_encoder(chunk, hashes, texts)


class EncodingError(UserError, RuntimeError):
    """An encoding worker process died (one line)."""


class EncoderPool:
    """Encodes chunks in `workers` processes (in this one when `workers` is 1), in order,
    with at most two chunks per worker in flight, so memory stays flat. A worker that
    dies (killed, out of memory) stops preprocessing with an `EncodingError`."""

    def __init__(self, encoder_args: tuple, workers: int):
        self.workers = workers
        self._local = _Encoder(*encoder_args) if workers <= 1 else None
        self._pool = (
            None
            if workers <= 1
            else ProcessPoolExecutor(
                workers,
                mp_context=mp.get_context("spawn"),
                initializer=_start_worker,
                initargs=encoder_args,
            )
        )
        self._broken = False
        self._workers: dict = {}  # every worker process started, to stop them all

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._pool is None:
            return
        if exc_type is None and not self._broken:
            try:
                self._pool.shutdown(wait=True)
                return
            except BaseException:  # Ctrl-C while the workers finish: stop them, as below
                self._stop()
                raise
        self._stop()

    def _stop(self) -> None:
        """Stopped early (an error, Ctrl-C, a dead worker): the workers' results are not
        wanted; stop them now rather than wait (a pool broken by a dead worker can wait
        forever on the survivors, and an idle worker left alive would keep this process
        from exiting). They ignore SIGTERM (`mtkit.core.signals`): SIGKILL."""
        self._workers.update(getattr(self._pool, "_processes", None) or {})
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in self._workers.values():
            worker.kill()
            worker.join()

    def encode(self, chunks: Iterator[Chunk], hashes: bool, texts: bool) -> Iterator[Encoded]:
        if self._pool is None:
            for chunk in chunks:
                yield self._local(chunk, hashes, texts)
            return
        pending: deque[Future] = deque()
        try:
            for chunk in chunks:
                with held_while_starting_workers():  # a submit may start a worker
                    pending.append(self._pool.submit(_encode_in_worker, chunk, hashes, texts))
                    self._workers.update(self._pool._processes or {})  # pid -> Process
                if len(pending) >= 2 * self.workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            self._broken = True
            raise EncodingError(
                "an encoding worker process died (killed, or out of "
                "memory?); nothing was written; rerun `mtkit preprocess`"
            ) from None


def length_filter(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, cfg: DataConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Masks over pairs: both sides within [min_len, max_len] subwords (`length_ok`), and
    the longer side at most `max_len_ratio` times the shorter (`ratio_ok`)."""
    s = np.asarray(src_lengths, dtype=np.int64)
    t = np.asarray(tgt_lengths, dtype=np.int64)
    length_ok = (s >= cfg.min_len) & (t >= cfg.min_len) & (s <= cfg.max_len) & (t <= cfg.max_len)
    ratio_ok = np.maximum(s, t) <= cfg.max_len_ratio * np.maximum(np.minimum(s, t), 1)
    return length_ok, ratio_ok


FILTERS = ("empty", "duplicate", "length", "ratio")  # and "language" with data.langid_filter


def _in_languages(
    chunks: Iterator[Chunk], langs: tuple[str, str], cfg: DataConfig, dropped: dict[str, int]
) -> Iterator[Chunk]:
    """`data.langid_filter`: the pairs whose source is detected as `langs[0]` and target
    as `langs[1]`, told apart among the run's languages (`mtkit.core.langid`); the others
    are counted in dropped["language"]. A multilingual run's tags are not looked at."""
    among = sorted({x for pair in languages.directions(cfg) for x in pair})
    for src, tgt in chunks:
        keep = [
            a and b
            for a, b in zip(
                in_language([languages.without_tag(x) for x in src], langs[0], among),
                in_language([languages.without_tag(y) for y in tgt], langs[1], among),
                strict=True,
            )
        ]
        dropped["language"] += keep.count(False)
        yield (
            [x for x, k in zip(src, keep, strict=True) if k],
            [y for y, k in zip(tgt, keep, strict=True) if k],
        )


def _write_corpus(
    corpus: Corpus,
    pool: EncoderPool,
    writer: ShardWriter,
    cfg: DataConfig,
    train: bool,
    seen: SeenHashes | None,
    progress: ProgressLog,
    langs: tuple[str, str] | None = None,
) -> dict:
    """Clean, filter, encode and append one corpus (then its weight's repeats). Returns
    its report: pairs read, kept, written (kept times weight) and dropped per filter.
    `langs`: the corpus's (source, target) languages, for `data.langid_filter`."""
    dropped = dict.fromkeys(FILTERS, 0)
    first, read = len(writer), 0
    chunks = corpus.chunks()
    if train and cfg.langid_filter and langs is not None:
        dropped["language"] = 0
        chunks = _in_languages(chunks, langs, cfg, dropped)
    for chunk in pool.encode(chunks, hashes=seen is not None, texts=not train):
        pairs = chunk.empty + len(chunk)  # as read, before cleaning
        progress.advance(pairs)
        read += pairs
        dropped["empty"] += chunk.empty
        keep = np.ones(len(chunk), dtype=bool)
        if seen is not None:
            keep = seen.first_seen(chunk.hashes)
            dropped["duplicate"] += int((~keep).sum())
        if train:  # valid and test keep every non-empty pair
            length_ok, ratio_ok = length_filter(chunk.src_lengths, chunk.tgt_lengths, cfg)
            dropped["length"] += int((keep & ~length_ok).sum())
            dropped["ratio"] += int((keep & length_ok & ~ratio_ok).sum())
            keep &= length_ok & ratio_ok
        writer.append(chunk, keep)
    read += dropped.get("language", 0)
    progress.advance(dropped.get("language", 0))
    kept = len(writer) - first
    if corpus.weight > 1 and kept:
        writer.repeat(first, corpus.weight - 1)
    return {
        "origin": corpus.origin,
        "read": read,
        "kept": kept,
        "weight": corpus.weight,
        "written": len(writer) - first,
        "dropped": dropped,
    }


def preprocess(cfg: Config, parallel_from: int = 4 * CHUNK_PAIRS) -> dict[str, dict]:
    """Read, clean, encode and store every configured split, streamed chunk by chunk.
    Encoding runs in `data.workers` processes when there are at least `parallel_from`
    pairs. Returns the manifests."""
    with run_lock(cfg.run_path, "preprocess"):
        remove_leftovers(cfg.run_path, ("data", "config.yaml"))
        return _preprocess(cfg, parallel_from)


def _preprocess(cfg: Config, parallel_from: int) -> dict[str, dict]:
    run = cfg.run_path
    src_vocab, tgt_vocab = load_vocabs(run, cfg.tokenizer.joint)
    meta = {"tokenizer": tokenizer_digests(src_vocab, tgt_vocab)}
    data = training_data(cfg)  # data.train, or a teacher's translations of its source
    distilled = distilled_manifest(cfg) if cfg.distill.teacher else None
    if distilled:
        meta["distilled"] = distilled["corpus_sha256"]
    if not data.corpora("train"):
        raise DataError("data.train is not set")
    # Open (and count) every corpus before writing anything: a line-count mismatch or a
    # missing file stops here.
    splits = {split: open_split(data, split, run / "cache", cfg.model.lang_tag) for split in SPLITS}
    splits = {split: corpora for split, corpora in splits.items() if corpora}
    total = sum(c.size for corpora in splits.values() for c in corpora)
    vocab_size = max(len(src_vocab), len(tgt_vocab))
    dtype = ids_dtype(vocab_size).name
    workers = cfg.data.workers if total >= parallel_from else 1
    progress = ProgressLog(total)
    manifests = {}
    with (
        atomic_dir(run / "data") as out,
        EncoderPool(
            (
                (src_vocab.model_proto, src_vocab.pieces),
                (tgt_vocab.model_proto, tgt_vocab.pieces),
                dtype,
            ),
            workers,
        ) as pool,
    ):
        for split, corpora in splits.items():
            start = time.perf_counter()
            train = split == "train"
            seen = SeenHashes() if cfg.data.dedup and train else None
            writer = ShardWriter(out / split, vocab_size, texts=not train)
            try:
                reports = [
                    _write_corpus(
                        c, pool, writer, data, train, seen, progress, direction(given, data)
                    )
                    for c, given in zip(corpora, data.corpora(split), strict=True)
                ]
            finally:
                writer.close()
            for report, corpus in zip(reports, data.corpora(split), strict=True):
                report["direction"] = name(direction(corpus, data))
            dropped = {
                f: sum(r["dropped"].get(f, 0) for r in reports)
                for f in dict.fromkeys(f for r in reports for f in r["dropped"])
            }
            origin = " and ".join(c.origin for c in corpora)
            if not len(writer):
                raise DataError(
                    f"data.{split}: no pairs left after cleaning ({origin}; dropped: {dropped})"
                )
            manifests[split] = writer.finish(
                {
                    "origin": origin,
                    "dropped": dropped,
                    "corpora": reports,
                    "directions": _directions(reports, data),
                    **meta,
                }
            )
            read = sum(r["read"] for r in reports)
            seconds = time.perf_counter() - start
            log.info(
                "%s: wrote %d pairs (%d read) from %s; dropped %s (%.1fs, %.0f pairs/s)",
                split,
                len(writer),
                read,
                origin,
                dropped,
                seconds,
                read / max(seconds, 1e-9),
            )
    if cfg.train.guided_alignment:  # the training pairs' links, beside their shard
        align_shard(run / "data" / "train")
    save_config(cfg, run / "config.yaml")
    return manifests


def _directions(reports: list[dict], cfg: DataConfig) -> dict[str, dict]:
    """The split's pairs per direction, and each one's share of a training epoch under
    `data.temperature` (the pairs' own share at 1)."""
    pairs: dict[str, int] = {}
    for report in reports:
        pairs[report["direction"]] = pairs.get(report["direction"], 0) + report["written"]
    share = (
        shares({d: n for d, n in pairs.items() if n}, cfg.temperature)
        if any(pairs.values())
        else {}
    )
    return {d: {"pairs": n, "share": round(share.get(d, 0.0), 6)} for d, n in pairs.items()}


def verify_shards(cfg: Config) -> dict[str, dict]:
    """`mtkit preprocess --verify`: check every split's sizes, offsets, checksums and
    tokenizer fingerprint without writing anything. Every split the config names must
    be there (a missing one is one line naming it). Returns the manifests."""
    src_vocab, tgt_vocab = load_vocabs(cfg.run_path, cfg.tokenizer.joint)
    manifests = {}
    for split in SPLITS:
        folder = cfg.run_path / "data" / split
        named = split == "train" or bool(cfg.data.corpora(split))
        if named and not (folder / "manifest.json").exists():
            raise DataError(f"{folder}: missing, but the config names data.{split}; {RERUN}")
        if named or folder.exists():
            shard = ShardDataset(folder)
            shard.verify()
            shard.check_tokenizer(src_vocab, tgt_vocab)
            manifests[split] = shard.manifest
    return manifests

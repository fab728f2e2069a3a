"""Preprocessing: encode every split once with SentencePiece and store binarized shards.

A split's folder `RUN/data/<split>/` holds

    src.bin, tgt.bin     all token ids of one side, concatenated (uint16, or uint32 for
                         vocabularies over 65,536 pieces), no bos/eos
    src.idx, tgt.idx     int64 offsets, n+1 of them: sentence i is bin[idx[i]:idx[i+1]]
    src.txt, tgt.txt     the cleaned text (valid and test only: references for BLEU)
    manifest.json        counts, dtype, filter report (per corpus and in all), the SHA-256
                         of the tokenizer model(s) the ids come from, and each file's size
                         and SHA-256; written last

Preprocessing streams: each corpus is read in chunks, cleaned and encoded (in worker
processes for large inputs), filtered, and appended to the files, so memory stays flat
whatever the corpus size. Exact duplicates are found by 8-byte pair hashes.

Training reads the .bin files memory-mapped (`ShardDataset`). `RUN/data` is written to a
temporary folder and renamed into place, so an interrupted run leaves no partial data.
Opening a shard checks every file's size and the offsets against the data; `verify`
checks the checksums too (training does at start, `mtkit preprocess --verify` on demand).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import time
import unicodedata
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np

from mtkit.atomic import atomic_dir, remove_leftovers
from mtkit.checksum import bytes_sha256, file_sha256
from mtkit.config import Config, DataConfig, save_config
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
from mtkit.errors import UserError, plural
from mtkit.rundir import run_lock
from mtkit.vocab import Vocab, load_vocabs

log = logging.getLogger(__name__)

FORMAT = "mtkit-shards-2"
SPLITS = ("train", "valid", "test")
RERUN = "rerun `mtkit preprocess`"


def tokenizer_digests(src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, str]:
    """SHA-256 of the SentencePiece model(s) that ids were encoded with."""
    return {"src": bytes_sha256(src_vocab.model_proto), "tgt": bytes_sha256(tgt_vocab.model_proto)}


@dataclass
class Encoded:
    """One chunk after cleaning and encoding, its pairs with an empty side left out.
    Lengths are per pair; ids are the pairs' ids concatenated in the shard's dtype."""

    empty: int  # pairs dropped for an empty side
    src_lengths: np.ndarray  # int32
    tgt_lengths: np.ndarray
    src_ids: np.ndarray
    tgt_ids: np.ndarray
    hashes: np.ndarray | None  # uint64 pair hashes, when deduplicating
    texts: tuple[list[str], list[str]] | None  # the cleaned text, for valid and test

    def __len__(self) -> int:
        return len(self.src_lengths)


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
        self._index.update(zip(words, range(len(self._index), len(self._index) + len(words)),
                               strict=True))
        self._starts = np.concatenate((self._starts, len(self._pieces) + np.cumsum(lengths)
                                       - lengths))
        self._lengths = np.concatenate((self._lengths, lengths))
        self._pieces = np.concatenate((self._pieces, flat))

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Cleaned sentences -> (lengths int32, concatenated ids)."""
        safe = [x.isprintable() and unicodedata.is_normalized("NFKC", x) for x in sentences]
        if not (self.exact and sentences and all(safe)):
            if not self.exact or not any(safe):
                return self._flat(self.vocab.encode(sentences))
            pieces = self._word_pieces([x for x, ok in zip(sentences, safe, strict=True) if ok])
            whole = iter(self.vocab.encode([x for x, ok in zip(sentences, safe, strict=True)
                                            if not ok]))
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
        flat = self._pieces[np.repeat(self._starts[rows] - ends + word_lengths, word_lengths)
                            + np.arange(ends[-1] if len(ends) else 0)]
        counts = np.fromiter((x.count(" ") + 1 for x in sentences), dtype=np.int64,
                             count=len(sentences))
        lengths = np.add.reduceat(word_lengths, np.cumsum(counts) - counts).astype(np.int32)
        if not self._agrees(sentences, lengths, flat):
            return self._flat(self.vocab.encode(sentences))
        return lengths, flat

    def _word_pieces(self, sentences: list[str]) -> Iterator[list[int]]:
        lengths, flat = self.encode(sentences)
        ends = np.cumsum(lengths)
        return (flat[e - n:e].tolist() for n, e in zip(lengths, ends, strict=True))

    def _agrees(self, sentences: list[str], lengths: np.ndarray, flat: np.ndarray) -> bool:
        """Encode a spread of the sentences whole and compare; turn the cache off if any
        differs."""
        picks = range(0, len(sentences), max(len(sentences) // self.CHECKS, 1))
        ends = np.cumsum(lengths)
        whole = self.vocab.encode([sentences[i] for i in picks])
        for i, ids in zip(picks, whole, strict=True):
            if flat[ends[i] - lengths[i]:ends[i]].tolist() != ids:
                log.warning("word-by-word encoding differs from SentencePiece's on %r; "
                            "encoding whole sentences from here on", sentences[i][:80])
                self.exact = False
                return False
        return True


class _Encoder:
    """Cleans and encodes chunks; lives in each worker process (built there once)."""

    def __init__(self, src_proto: bytes, tgt_proto: bytes, dtype: str):
        src_vocab = Vocab(src_proto)
        tgt_vocab = src_vocab if tgt_proto == src_proto else Vocab(tgt_proto)
        self.src = WordCache(src_vocab, np.dtype(dtype))
        self.tgt = self.src if tgt_vocab is src_vocab else WordCache(tgt_vocab, np.dtype(dtype))

    def __call__(self, chunk: Chunk, hashes: bool, texts: bool) -> Encoded:
        src, tgt, keep = clean(*chunk)
        if not keep.all():
            src = [x for x, k in zip(src, keep, strict=True) if k]
            tgt = [x for x, k in zip(tgt, keep, strict=True) if k]
        src_lengths, src_ids = self.src.encode(src)
        tgt_lengths, tgt_ids = self.tgt.encode(tgt)
        return Encoded(int((~keep).sum()), src_lengths, tgt_lengths, src_ids, tgt_ids,
                       pair_hashes(src, tgt) if hashes else None,
                       (src, tgt) if texts else None)


_worker_encoder: _Encoder | None = None  # one per worker process


def _start_worker(*args) -> None:
    global _worker_encoder
    _worker_encoder = _Encoder(*args)


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
        self._pool = None if workers <= 1 else ProcessPoolExecutor(
            workers, mp_context=mp.get_context("spawn"), initializer=_start_worker,
            initargs=encoder_args)
        self._broken = False

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._pool is None:
            return
        if exc_type is None and not self._broken:
            self._pool.shutdown(wait=True)
            return
        # Stopped early (an error, Ctrl-C, a dead worker): the workers' results are not
        # wanted; stop them now rather than wait (a pool broken by a dead worker can wait
        # forever on the survivors).
        workers = list(getattr(self._pool, "_processes", {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
            worker.join()

    def encode(self, chunks: Iterator[Chunk], hashes: bool, texts: bool) -> Iterator[Encoded]:
        if self._pool is None:
            for chunk in chunks:
                yield self._local(chunk, hashes, texts)
            return
        pending: deque[Future] = deque()
        try:
            for chunk in chunks:
                pending.append(self._pool.submit(_encode_in_worker, chunk, hashes, texts))
                if len(pending) >= 2 * self.workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            self._broken = True
            raise EncodingError("an encoding worker process died (killed, or out of "
                                "memory?); nothing was written; rerun `mtkit preprocess`"
                                ) from None


def length_filter(src_lengths: np.ndarray, tgt_lengths: np.ndarray, cfg: DataConfig
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Masks over pairs: both sides within [min_len, max_len] subwords (`length_ok`), and
    the longer side at most `max_len_ratio` times the shorter (`ratio_ok`)."""
    s = np.asarray(src_lengths, dtype=np.int64)
    t = np.asarray(tgt_lengths, dtype=np.int64)
    length_ok = (s >= cfg.min_len) & (t >= cfg.min_len) & (s <= cfg.max_len) & (t <= cfg.max_len)
    ratio_ok = np.maximum(s, t) <= cfg.max_len_ratio * np.maximum(np.minimum(s, t), 1)
    return length_ok, ratio_ok


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of the vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class _HashedFile:
    """A new file written in appends, its size and SHA-256 kept as it grows."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "xb")  # a new file in preprocess's temporary folder
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | np.ndarray) -> None:
        payload = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(
            data, np.ndarray) else memoryview(data)
        self._file.write(payload)
        self._sha.update(payload)
        self.bytes += payload.nbytes

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def summary(self) -> dict:
        """What the manifest records of the file."""
        return {"bytes": self.bytes, "sha256": self._sha.hexdigest()}


class _Side:
    """One side of a shard: ids appended to NAME.bin, offsets to NAME.idx."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype):
        self.dtype = dtype
        self.bin = _HashedFile(folder / f"{name}.bin")
        self.idx = _HashedFile(folder / f"{name}.idx")
        self.idx.write(np.zeros(1, dtype=np.int64))
        self.tokens = 0
        self.pairs = 0

    def append(self, lengths: np.ndarray, ids: np.ndarray) -> None:
        self.bin.write(ids.astype(self.dtype, copy=False))
        self.idx.write(self.tokens + np.cumsum(lengths, dtype=np.int64))
        self.tokens += len(ids)
        self.pairs += len(lengths)

    def repeat(self, first: int, times: int, block: int = 1 << 20) -> None:
        """Append pairs `first`.. (to the end) `times` more times, reading them back from
        the files in blocks of `block` pairs."""
        self.bin.flush()
        self.idx.flush()
        end = self.pairs
        offsets = np.fromfile(self.idx.path, dtype=np.int64, count=end - first + 1,
                              offset=8 * first)
        for _ in range(times):
            for a in range(0, end - first, block):
                b = min(a + block, end - first)
                ids = np.fromfile(self.bin.path, dtype=self.dtype,
                                  count=int(offsets[b] - offsets[a]),
                                  offset=int(offsets[a]) * self.dtype.itemsize)
                self.append(np.diff(offsets[a:b + 1]), ids)


class ShardWriter:
    """Writes one split's shard as its pairs stream in; the manifest comes last."""

    def __init__(self, folder: Path, vocab_size: int, texts: bool):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.dtype = ids_dtype(vocab_size)
        self.src, self.tgt = _Side(folder, "src", self.dtype), _Side(folder, "tgt", self.dtype)
        self.texts = (_HashedFile(folder / "src.txt"), _HashedFile(folder / "tgt.txt")) \
            if texts else None

    def __len__(self) -> int:
        return self.src.pairs

    def append(self, chunk: Encoded, keep: np.ndarray) -> None:
        """Write the chunk's pairs where `keep` is true."""
        for side, lengths, ids in ((self.src, chunk.src_lengths, chunk.src_ids),
                                   (self.tgt, chunk.tgt_lengths, chunk.tgt_ids)):
            if not keep.all():
                ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep]
            side.append(lengths, ids)
        if self.texts is not None:
            for out, lines in zip(self.texts, chunk.texts, strict=True):
                out.write("".join(x + "\n" for x, k in zip(lines, keep, strict=True)
                                  if k).encode())

    def repeat(self, first: int, times: int) -> None:
        """Append pairs `first`.. `times` more times (a corpus's weight)."""
        if self.texts is not None:
            raise ValueError("only shards without texts repeat pairs")  # config refuses it
        self.src.repeat(first, times)
        self.tgt.repeat(first, times)

    def _files(self) -> tuple[_HashedFile, ...]:
        return (self.src.bin, self.src.idx, self.tgt.bin, self.tgt.idx, *(self.texts or ()))

    def close(self) -> None:
        """Close every file, even when closing one fails (its buffer cannot be flushed to
        a full disk), so no descriptor outlives a failed run. Raises the first failure."""
        failure = None
        for out in self._files():
            try:
                out.close()
            except OSError as e:
                failure = failure or e
        if failure is not None:
            raise failure

    def finish(self, meta: dict) -> dict:
        """Close the files and write the manifest (last). Returns the manifest."""
        self.close()
        manifest = {"format": FORMAT, "pairs": self.src.pairs, "dtype": self.dtype.name,
                    "src_tokens": self.src.tokens, "tgt_tokens": self.tgt.tokens, **meta,
                    "files": {out.path.name: out.summary() for out in self._files()}}
        with open(self.folder / "manifest.json", "xb") as f:  # new, in the temporary folder
            f.write((json.dumps(manifest, indent=2) + "\n").encode())
        return manifest


FILTERS = ("empty", "duplicate", "length", "ratio")


class ProgressLog:
    """Logs how far preprocessing is, at most every `every` seconds: pairs read of the
    total (known from the opened corpora), pairs/s and the time left."""

    def __init__(self, total: int, every: float = 10.0):
        self.total, self.every = total, every
        self.done = 0
        self.start = self.last = time.perf_counter()

    def advance(self, pairs: int) -> None:
        self.done += pairs
        now = time.perf_counter()
        if now - self.last < self.every or not self.total:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        log.info("preprocess: %s of %s pairs (%.0f%%), %s pairs/s, ~%.0f s left",
                 f"{self.done:,}", f"{self.total:,}", 100 * self.done / self.total,
                 f"{rate:,.0f}", (self.total - self.done) / max(rate, 1e-9))


def _write_corpus(corpus: Corpus, pool: EncoderPool, writer: ShardWriter, cfg: DataConfig,
                  train: bool, seen: SeenHashes | None, progress: ProgressLog) -> dict:
    """Clean, filter, encode and append one corpus (then its weight's repeats). Returns
    its report: pairs read, kept, written (kept times weight) and dropped per filter."""
    dropped = dict.fromkeys(FILTERS, 0)
    first, read = len(writer), 0
    for chunk in pool.encode(corpus.chunks(), hashes=seen is not None, texts=not train):
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
    kept = len(writer) - first
    if corpus.weight > 1 and kept:
        writer.repeat(first, corpus.weight - 1)
    return {"origin": corpus.origin, "read": read, "kept": kept, "weight": corpus.weight,
            "written": len(writer) - first, "dropped": dropped}


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
    if not cfg.data.corpora("train"):
        raise DataError("data.train is not set")
    # Open (and count) every corpus before writing anything: a line-count mismatch or a
    # missing file stops here.
    splits = {split: open_split(cfg.data, split, run / "cache") for split in SPLITS}
    splits = {split: corpora for split, corpora in splits.items() if corpora}
    total = sum(c.size for corpora in splits.values() for c in corpora)
    vocab_size = max(len(src_vocab), len(tgt_vocab))
    dtype = ids_dtype(vocab_size).name
    workers = cfg.data.workers if total >= parallel_from else 1
    progress = ProgressLog(total)
    manifests = {}
    with (atomic_dir(run / "data") as out,
          EncoderPool((src_vocab.model_proto, tgt_vocab.model_proto, dtype), workers) as pool):
        for split, corpora in splits.items():
            start = time.perf_counter()
            train = split == "train"
            seen = SeenHashes() if cfg.data.dedup and train else None
            writer = ShardWriter(out / split, vocab_size, texts=not train)
            try:
                reports = [_write_corpus(c, pool, writer, cfg.data, train, seen, progress)
                           for c in corpora]
            finally:
                writer.close()
            dropped = {f: sum(r["dropped"][f] for r in reports) for f in FILTERS}
            origin = " and ".join(c.origin for c in corpora)
            if not len(writer):
                raise DataError(f"data.{split}: no pairs left after cleaning ({origin}; "
                                f"dropped: {dropped})")
            manifests[split] = writer.finish({"origin": origin, "dropped": dropped,
                                              "corpora": reports, **meta})
            read = sum(r["read"] for r in reports)
            seconds = time.perf_counter() - start
            log.info("%s: wrote %d pairs (%d read) from %s; dropped %s (%.1fs, %.0f pairs/s)",
                     split, len(writer), read, origin, dropped, seconds,
                     read / max(seconds, 1e-9))
    save_config(cfg, run / "config.yaml")
    return manifests


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


class ShardDataset:
    """Random access to one split's pairs, memory-mapped and opened lazily (so that each
    DataLoader worker maps the files itself instead of receiving copies).

    Opening checks what is cheap: every file's size against the manifest and the offsets
    against the data, so a truncated or mismatched file is a `DataError` naming it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        manifest_path = self.folder / "manifest.json"
        if not manifest_path.exists():
            raise DataError(f"{self.folder}: no finished shard here; run `mtkit preprocess`")
        raw = manifest_path.read_bytes()
        try:
            self.manifest = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{manifest_path}: corrupt manifest (not JSON); {RERUN}") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise DataError(f"{self.folder}: shard format {found!r}, expected {FORMAT!r}; "
                            f"{RERUN}")
        self.fingerprint = bytes_sha256(raw)  # what a checkpoint records it was trained on
        try:
            self._check_sizes()
            # int32 lengths: 8 bytes a pair for both sides, all the sampler needs
            self.src_lengths = np.diff(self._offsets("src")).astype(np.int32)
            self.tgt_lengths = np.diff(self._offsets("tgt")).astype(np.int32)
        except (KeyError, TypeError, AttributeError):
            raise DataError(f"{manifest_path}: corrupt manifest (fields missing or of the "
                            f"wrong type); {RERUN}") from None
        self._maps: tuple[np.ndarray, ...] | None = None  # mapped when first read

    def _check_sizes(self) -> None:
        for name, expected in self.manifest["files"].items():
            path = self.folder / name
            if not path.is_file():
                raise DataError(f"{path}: missing from the shard; {RERUN}")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise DataError(f"{path}: {size} bytes, the manifest says {expected['bytes']} "
                                f"(truncated or changed since preprocessing); {RERUN}")

    def _offsets(self, side: str) -> np.ndarray:
        """The n+1 offsets of one side, checked: 0 first, never decreasing, the last one
        the number of ids in the .bin file."""
        path = self.folder / f"{side}.idx"
        offsets = np.memmap(path, dtype=np.int64, mode="r")
        n, tokens = self.manifest["pairs"], self.manifest[f"{side}_tokens"]
        data_bytes = (self.folder / f"{side}.bin").stat().st_size
        ok = (len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == tokens
              and data_bytes == tokens * np.dtype(self.manifest["dtype"]).itemsize
              and bool((np.diff(offsets) >= 0).all()))
        if not ok:
            raise DataError(f"{path}: offsets do not match the data ({plural(n, 'pair')}, "
                            f"{tokens} ids in {side}.bin); the shard is corrupt; {RERUN}")
        return offsets

    def verify(self) -> None:
        """Check every file's SHA-256 against the manifest (about 1.5 GB/s)."""
        for name, expected in self.manifest["files"].items():
            if file_sha256(self.folder / name) != expected["sha256"]:
                raise DataError(f"{self.folder / name}: checksum mismatch (the file changed "
                                f"since preprocessing: corrupt or edited); {RERUN}")

    def check_tokenizer(self, src_vocab: Vocab, tgt_vocab: Vocab) -> None:
        """Refuse shards encoded with another tokenizer than the run's current one."""
        if self.manifest.get("tokenizer") != tokenizer_digests(src_vocab, tgt_vocab):
            raise DataError(f"{self.folder} was encoded with another tokenizer than the run's "
                            f"spm model (the tokenizer was retrained after preprocessing); "
                            f"{RERUN}")

    def __len__(self) -> int:
        return len(self.src_lengths)

    def _open(self) -> tuple[np.ndarray, ...]:
        """src ids, tgt ids, src offsets, tgt offsets: memory-mapped, so they take page
        cache, not this process's memory, and DataLoader workers share them."""
        if self._maps is None:
            dtype = np.dtype(self.manifest["dtype"])
            self._maps = tuple(
                np.memmap(self.folder / f"{name}.bin", dtype=dtype, mode="r")
                if self.manifest[f"{name}_tokens"] else np.zeros(0, dtype=dtype)
                for name in ("src", "tgt")) + tuple(
                np.memmap(self.folder / f"{name}.idx", dtype=np.int64, mode="r")
                for name in ("src", "tgt"))
        return self._maps

    def __getstate__(self) -> dict:  # a worker maps the files itself
        return {**self.__dict__, "_maps": None}

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt, src_offsets, tgt_offsets = self._open()
        return (src[src_offsets[i]:src_offsets[i + 1]],
                tgt[tgt_offsets[i]:tgt_offsets[i + 1]])

    def texts(self, side: str) -> list[str]:
        """The cleaned text of one side (valid and test splits only)."""
        path = self.folder / f"{side}.txt"
        return path.read_text("utf-8").split("\n")[:-1] if path.exists() else []

"""Binarized shards: the format, the writer and the reader (I/O).

A split's folder `RUN/data/<split>/` holds

    src.bin, tgt.bin     all token ids of one side, concatenated (uint16, or uint32 for
                         vocabularies over 65,536 pieces), no bos/eos
    src.idx, tgt.idx     int64 offsets, n+1 of them: sentence i is bin[idx[i]:idx[i+1]]
    src.txt, tgt.txt     the cleaned text (valid and test only: references for BLEU)
    manifest.json        counts, dtype, filter report (per corpus and in all), the SHA-256
                         of the tokenizer model(s) the ids come from, and each file's size
                         and SHA-256; written last

`ShardWriter` appends encoded pairs to the files as they stream in (the preprocess
stage, `mtkit.stages.preprocess`, feeds it), keeping each file's size and SHA-256 as it grows.
Training reads the .bin files memory-mapped (`ShardDataset`). Opening a shard checks
every file's size and the offsets against the data; `verify` checks the checksums too
(training does at start, `mtkit preprocess --verify` on demand).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtkit.core.checksum import bytes_sha256, file_sha256
from mtkit.core.errors import plural
from mtkit.core.vocab import Vocab
from mtkit.data.sources import DataError

FORMAT = "mtkit-shards-2"
SPLITS = ("train", "valid", "test")
RERUN = "rerun `mtkit preprocess`"


def tokenizer_digests(src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, str]:
    """SHA-256 of the SentencePiece model(s) that ids were encoded with (and of the id
    table, for a vocabulary that has one)."""

    def digest(vocab: Vocab) -> str:
        table = b"" if vocab.pieces is None else "\n".join(vocab.pieces).encode("utf-8")
        return bytes_sha256(vocab.model_proto + table)

    return {"src": digest(src_vocab), "tgt": digest(tgt_vocab)}


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of the vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass
class Encoded:
    """One chunk after cleaning and encoding, its pairs with an empty side left out: what
    the preprocess stage's encoder gives and `ShardWriter.append` takes. Lengths are per
    pair; ids are the pairs' ids concatenated in the shard's dtype."""

    empty: int  # pairs dropped for an empty side
    src_lengths: np.ndarray  # int32
    tgt_lengths: np.ndarray
    src_ids: np.ndarray
    tgt_ids: np.ndarray
    hashes: np.ndarray | None  # uint64 pair hashes, when deduplicating
    texts: tuple[list[str], list[str]] | None  # the cleaned text, for valid and test

    def __len__(self) -> int:
        return len(self.src_lengths)


class _HashedFile:
    """A new file written in appends, its size and SHA-256 kept as it grows."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "xb")  # a new file in preprocess's temporary folder
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | np.ndarray) -> None:
        payload = (
            memoryview(np.ascontiguousarray(data)).cast("B")
            if isinstance(data, np.ndarray)
            else memoryview(data)
        )
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
        offsets = np.fromfile(
            self.idx.path, dtype=np.int64, count=end - first + 1, offset=8 * first
        )
        for _ in range(times):
            for a in range(0, end - first, block):
                b = min(a + block, end - first)
                ids = np.fromfile(
                    self.bin.path,
                    dtype=self.dtype,
                    count=int(offsets[b] - offsets[a]),
                    offset=int(offsets[a]) * self.dtype.itemsize,
                )
                self.append(np.diff(offsets[a : b + 1]), ids)


class ShardWriter:
    """Writes one split's shard as its pairs stream in; the manifest comes last."""

    def __init__(self, folder: Path, vocab_size: int, texts: bool):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.dtype = ids_dtype(vocab_size)
        self.src, self.tgt = _Side(folder, "src", self.dtype), _Side(folder, "tgt", self.dtype)
        self.texts = (
            (_HashedFile(folder / "src.txt"), _HashedFile(folder / "tgt.txt")) if texts else None
        )

    def __len__(self) -> int:
        return self.src.pairs

    def append(self, chunk: Encoded, keep: np.ndarray) -> None:
        """Write the chunk's pairs where `keep` is true."""
        for side, lengths, ids in (
            (self.src, chunk.src_lengths, chunk.src_ids),
            (self.tgt, chunk.tgt_lengths, chunk.tgt_ids),
        ):
            if not keep.all():
                ids, lengths = ids[np.repeat(keep, lengths)], lengths[keep]
            side.append(lengths, ids)
        if self.texts is not None:
            for out, lines in zip(self.texts, chunk.texts, strict=True):
                out.write("".join(x + "\n" for x, k in zip(lines, keep, strict=True) if k).encode())

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
        manifest = {
            "format": FORMAT,
            "pairs": self.src.pairs,
            "dtype": self.dtype.name,
            "src_tokens": self.src.tokens,
            "tgt_tokens": self.tgt.tokens,
            **meta,
            "files": {out.path.name: out.summary() for out in self._files()},
        }
        with open(self.folder / "manifest.json", "xb") as f:  # new, in the temporary folder
            f.write((json.dumps(manifest, indent=2) + "\n").encode())
        return manifest


COUNT_SLICE = 1 << 24  # ids counted at once: 128 MB of int64 copies, whatever the shard


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
            raise DataError(f"{self.folder}: shard format {found!r}, expected {FORMAT!r}; {RERUN}")
        self.fingerprint = bytes_sha256(raw)  # what a checkpoint records it was trained on
        try:
            self._check_sizes()
            # int32 lengths: 8 bytes a pair for both sides, all the sampler needs
            self.src_lengths = np.diff(self._offsets("src")).astype(np.int32)
            self.tgt_lengths = np.diff(self._offsets("tgt")).astype(np.int32)
        except (KeyError, TypeError, AttributeError):
            raise DataError(
                f"{manifest_path}: corrupt manifest (fields missing or of the wrong type); {RERUN}"
            ) from None
        self._maps: tuple[np.ndarray, ...] | None = None  # mapped when first read

    def _check_sizes(self) -> None:
        for name, expected in self.manifest["files"].items():
            path = self.folder / name
            if not path.is_file():
                raise DataError(f"{path}: missing from the shard; {RERUN}")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise DataError(
                    f"{path}: {size} bytes, the manifest says {expected['bytes']} "
                    f"(truncated or changed since preprocessing); {RERUN}"
                )

    def _offsets(self, side: str) -> np.ndarray:
        """The n+1 offsets of one side, checked: 0 first, never decreasing, the last one
        the number of ids in the .bin file."""
        path = self.folder / f"{side}.idx"
        offsets = np.memmap(path, dtype=np.int64, mode="r")
        n, tokens = self.manifest["pairs"], self.manifest[f"{side}_tokens"]
        data_bytes = (self.folder / f"{side}.bin").stat().st_size
        ok = (
            len(offsets) == n + 1
            and offsets[0] == 0
            and offsets[-1] == tokens
            and data_bytes == tokens * np.dtype(self.manifest["dtype"]).itemsize
            and bool((np.diff(offsets) >= 0).all())
        )
        if not ok:
            raise DataError(
                f"{path}: offsets do not match the data ({plural(n, 'pair')}, "
                f"{tokens} ids in {side}.bin); the shard is corrupt; {RERUN}"
            )
        return offsets

    def verify(self) -> None:
        """Check every file's SHA-256 against the manifest (about 1.5 GB/s)."""
        for name, expected in self.manifest["files"].items():
            if file_sha256(self.folder / name) != expected["sha256"]:
                raise DataError(
                    f"{self.folder / name}: checksum mismatch (the file changed "
                    f"since preprocessing: corrupt or edited); {RERUN}"
                )

    def check_tokenizer(self, src_vocab: Vocab, tgt_vocab: Vocab) -> None:
        """Refuse shards encoded with another tokenizer than the run's current one."""
        if self.manifest.get("tokenizer") != tokenizer_digests(src_vocab, tgt_vocab):
            raise DataError(
                f"{self.folder} was encoded with another tokenizer than the run's "
                f"spm model (the tokenizer was retrained after preprocessing); "
                f"{RERUN}"
            )

    def __len__(self) -> int:
        return len(self.src_lengths)

    def _open(self) -> tuple[np.ndarray, ...]:
        """src ids, tgt ids, src offsets, tgt offsets: memory-mapped, so they take page
        cache, not this process's memory, and DataLoader workers share them."""
        if self._maps is None:
            dtype = np.dtype(self.manifest["dtype"])
            self._maps = tuple(
                np.memmap(self.folder / f"{name}.bin", dtype=dtype, mode="r")
                if self.manifest[f"{name}_tokens"]
                else np.zeros(0, dtype=dtype)
                for name in ("src", "tgt")
            ) + tuple(
                np.memmap(self.folder / f"{name}.idx", dtype=np.int64, mode="r")
                for name in ("src", "tgt")
            )
        return self._maps

    def __getstate__(self) -> dict:  # a worker maps the files itself
        return {**self.__dict__, "_maps": None}

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt, src_offsets, tgt_offsets = self._open()
        return (src[src_offsets[i] : src_offsets[i + 1]], tgt[tgt_offsets[i] : tgt_offsets[i + 1]])

    def directions(self) -> dict[str, np.ndarray]:
        """Each direction's pair indices ("en-de": ...), from the manifest's corpora, which
        preprocess writes one after another (a direction left with no pairs is not
        listed); a shard that records none: {"": all}."""
        out: dict[str, list[np.ndarray]] = {}
        first = 0
        for corpus in self.manifest.get("corpora", []):
            written = int(corpus.get("written", 0))
            out.setdefault(corpus.get("direction", ""), []).append(
                np.arange(first, first + written)
            )
            first += written
        if first != len(self) or not out:
            return {"": np.arange(len(self))}
        return {d: np.concatenate(parts) for d, parts in out.items() if sum(len(p) for p in parts)}

    def id_counts(self, side: str, pairs: np.ndarray, size: int) -> np.ndarray:
        """How often each id occurs on one side ("src", "tgt") of these pairs (sorted
        indices, such as a direction's): (size,) int64, read in runs of consecutive pairs."""
        src, tgt, src_offsets, tgt_offsets = self._open()
        ids, offsets = (src, src_offsets) if side == "src" else (tgt, tgt_offsets)
        counts = np.zeros(size, dtype=np.int64)
        for run in np.split(pairs, np.flatnonzero(np.diff(pairs) != 1) + 1):
            first, stop = (int(offsets[run[0]]), int(offsets[run[-1] + 1])) if len(run) else (0, 0)
            for start in range(first, stop, COUNT_SLICE):
                part = ids[start : min(start + COUNT_SLICE, stop)]
                counts += np.bincount(part, minlength=size)[:size]
        return counts

    def texts(self, side: str) -> list[str]:
        """The cleaned text of one side (valid and test splits only)."""
        path = self.folder / f"{side}.txt"
        return path.read_text("utf-8").split("\n")[:-1] if path.exists() else []

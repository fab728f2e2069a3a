"""Preprocessing: encode every split once with SentencePiece and store binarized shards.

A split's folder `RUN/data/<split>/` holds

    src.bin, tgt.bin     all token ids of one side, concatenated (uint16, or int32 for
                         vocabularies over 65,535), no bos/eos
    src.idx, tgt.idx     int64 offsets, n+1 of them: sentence i is bin[idx[i]:idx[i+1]]
    src.txt, tgt.txt     the cleaned text (valid and test only: references for BLEU)
    manifest.json        counts, dtype, filter report, the SHA-256 of the tokenizer
                         model(s) the ids come from, and each file's size and SHA-256;
                         written last

Training reads the .bin files memory-mapped (`ShardDataset`). `RUN/data` is written to a
temporary folder and renamed into place, so an interrupted run leaves no partial data.
Opening a shard checks every file's size and the offsets against the data; `verify`
checks the checksums too (training does at start, `mtkit preprocess --verify` on demand).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np

from mtkit.atomic import atomic_dir, remove_leftovers
from mtkit.config import Config, DataConfig, save_config
from mtkit.data.sources import DataError, Pairs, clean_pairs, hf_datasets, load_pairs
from mtkit.rundir import bytes_sha256, file_sha256, run_lock
from mtkit.tokenizer import Vocab, load_vocabs

log = logging.getLogger(__name__)

FORMAT = "mtkit-shards-2"
SPLITS = ("train", "valid", "test")
RERUN = "rerun `mtkit preprocess`"


def tokenizer_digests(src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, str]:
    """SHA-256 of the SentencePiece model(s) that ids were encoded with."""
    return {"src": bytes_sha256(src_vocab.model_proto), "tgt": bytes_sha256(tgt_vocab.model_proto)}


class _Encoder:
    """Picklable batch encoder for `datasets.map` worker processes."""

    def __init__(self, src_proto: bytes, tgt_proto: bytes):
        self.protos = (src_proto, tgt_proto)
        self.vocabs: tuple[Vocab, Vocab] | None = None

    def __call__(self, batch: dict) -> dict:
        if self.vocabs is None:  # built once per worker process
            self.vocabs = (Vocab(self.protos[0]), Vocab(self.protos[1]))
        return {"src_ids": self.vocabs[0].encode(batch["src"]),
                "tgt_ids": self.vocabs[1].encode(batch["tgt"])}


def encode_pairs(pairs: Pairs, src_vocab: Vocab, tgt_vocab: Vocab, workers: int,
                 cache_dir: Path | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """Encode both sides with SentencePiece, in `workers` processes for large inputs."""
    ds = hf_datasets().Dataset.from_dict({"src": pairs.src, "tgt": pairs.tgt})
    num_proc = workers if workers > 1 and len(pairs) >= 10_000 else None
    encoded = ds.map(_Encoder(src_vocab.model_proto, tgt_vocab.model_proto), batched=True,
                     batch_size=2000, num_proc=num_proc, remove_columns=["src", "tgt"],
                     cache_file_name=str(cache_dir / "encoded.arrow") if cache_dir else None,
                     load_from_cache_file=False)
    return list(encoded["src_ids"]), list(encoded["tgt_ids"])


def length_filter(src_ids: list[list[int]], tgt_ids: list[list[int]], cfg: DataConfig
                  ) -> tuple[np.ndarray, dict[str, int]]:
    """Boolean keep-mask over pairs: both sides within [min_len, max_len] subwords and
    the longer side at most `max_len_ratio` times the shorter."""
    s = np.fromiter((len(x) for x in src_ids), dtype=np.int64, count=len(src_ids))
    t = np.fromiter((len(x) for x in tgt_ids), dtype=np.int64, count=len(tgt_ids))
    length_ok = (s >= cfg.min_len) & (t >= cfg.min_len) & (s <= cfg.max_len) & (t <= cfg.max_len)
    ratio = np.maximum(s, t) / np.maximum(np.minimum(s, t), 1)
    ratio_ok = ratio <= cfg.max_len_ratio
    report = {"length": int((~length_ok).sum()), "ratio": int((length_ok & ~ratio_ok).sum())}
    return length_ok & ratio_ok, report


def _write_file(path: Path, data: bytes | np.ndarray, files: dict) -> None:
    """Write one shard file (inside the temporary folder) and record its size and hash."""
    payload = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(
        data, np.ndarray) else memoryview(data)
    with open(path, "xb") as f:  # a new file in preprocess's temporary folder
        f.write(payload)
    files[path.name] = {"bytes": payload.nbytes, "sha256": hashlib.sha256(payload).hexdigest()}


def _write_side(folder: Path, name: str, ids: list[list[int]], dtype, files: dict) -> int:
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for x in ids for i in x), dtype=dtype, count=int(offsets[-1]))
    _write_file(folder / f"{name}.bin", flat, files)
    _write_file(folder / f"{name}.idx", offsets, files)
    return int(offsets[-1])


def write_shard(folder: Path, src_ids: list[list[int]], tgt_ids: list[list[int]],
                vocab_size: int, meta: dict, texts: Pairs | None = None) -> dict:
    """Write one split's binarized shard and its manifest (last)."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max else np.int32
    files: dict[str, dict] = {}
    manifest = {
        "format": FORMAT,
        "pairs": len(src_ids),
        "dtype": np.dtype(dtype).name,
        "src_tokens": _write_side(folder, "src", src_ids, dtype, files),
        "tgt_tokens": _write_side(folder, "tgt", tgt_ids, dtype, files),
        **meta,
    }
    if texts is not None:
        for name, lines in (("src", texts.src), ("tgt", texts.tgt)):
            _write_file(folder / f"{name}.txt", "".join(x + "\n" for x in lines).encode(),
                        files)
    manifest["files"] = files
    _write_file(folder / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode(), {})
    return manifest


def preprocess(cfg: Config) -> dict[str, dict]:
    """Read, clean, encode and store every configured split. Returns the manifests."""
    with run_lock(cfg.run_path, "preprocess"):
        remove_leftovers(cfg.run_path, ("data", "config.yaml"))
        return _preprocess(cfg)


def _preprocess(cfg: Config) -> dict[str, dict]:
    run = cfg.run_path
    src_vocab, tgt_vocab = load_vocabs(run, cfg.tokenizer.joint)
    tokenizer = tokenizer_digests(src_vocab, tgt_vocab)
    cache = run / "cache"
    # Read and check every split before writing anything.
    todo: dict[str, Pairs] = {}
    for split in SPLITS:
        corpus = getattr(cfg.data, split)
        if not corpus.given:
            if split == "train":
                raise DataError("data.train is not set")
            continue
        pairs = clean_pairs(load_pairs(corpus, cfg.data.src_lang, cfg.data.tgt_lang, cache),
                            dedup=cfg.data.dedup and split == "train")
        if not len(pairs):
            raise DataError(f"data.{split}: no pairs left after cleaning "
                            f"({pairs.origin}; dropped: {pairs.report})")
        todo[split] = pairs
    manifests = {}
    with atomic_dir(run / "data") as out:
        for split, pairs in todo.items():
            start = time.perf_counter()
            src_ids, tgt_ids = encode_pairs(pairs, src_vocab, tgt_vocab, cfg.data.workers, cache)
            report = dict(pairs.report)
            if split == "train":  # valid and test keep every non-empty pair
                keep, dropped = length_filter(src_ids, tgt_ids, cfg.data)
                report.update(dropped)
                src_ids = [x for x, k in zip(src_ids, keep, strict=True) if k]
                tgt_ids = [x for x, k in zip(tgt_ids, keep, strict=True) if k]
            if not src_ids:
                raise DataError(f"data.{split}: no pairs left after cleaning "
                                f"({pairs.origin}; dropped: {report})")
            meta = {"origin": pairs.origin, "dropped": report, "tokenizer": tokenizer}
            texts = pairs if split != "train" else None
            manifests[split] = write_shard(out / split, src_ids, tgt_ids,
                                           max(len(src_vocab), len(tgt_vocab)), meta, texts)
            log.info("%s: kept %d pairs of %d from %s; dropped %s (%.1fs)", split,
                     len(src_ids), len(pairs) + sum(pairs.report.values()), pairs.origin,
                     report, time.perf_counter() - start)
    save_config(cfg, run / "config.yaml")
    return manifests


def verify_shards(cfg: Config) -> dict[str, dict]:
    """`mtkit preprocess --verify`: check every split's sizes, offsets, checksums and
    tokenizer fingerprint without writing anything. Returns the manifests."""
    src_vocab, tgt_vocab = load_vocabs(cfg.run_path, cfg.tokenizer.joint)
    manifests = {}
    for split in SPLITS:
        folder = cfg.run_path / "data" / split
        if split == "train" or folder.exists():
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
            self.src_offsets = self._offsets("src")
            self.tgt_offsets = self._offsets("tgt")
        except (KeyError, TypeError, AttributeError):
            raise DataError(f"{manifest_path}: corrupt manifest (fields missing or of the "
                            f"wrong type); {RERUN}") from None
        self.src_lengths = np.diff(self.src_offsets)
        self.tgt_lengths = np.diff(self.tgt_offsets)
        self._sides: tuple[np.ndarray, np.ndarray] | None = None

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
        offsets = np.fromfile(path, dtype=np.int64)
        n, tokens = self.manifest["pairs"], self.manifest[f"{side}_tokens"]
        data_bytes = (self.folder / f"{side}.bin").stat().st_size
        ok = (len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == tokens
              and data_bytes == tokens * np.dtype(self.manifest["dtype"]).itemsize
              and bool((np.diff(offsets) >= 0).all()))
        if not ok:
            raise DataError(f"{path}: offsets do not match the data ({n} pairs, {tokens} ids "
                            f"in {side}.bin); the shard is corrupt; {RERUN}")
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

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        if self._sides is None:
            dtype = np.dtype(self.manifest["dtype"])
            self._sides = tuple(
                np.memmap(self.folder / f"{name}.bin", dtype=dtype, mode="r")
                if self.manifest[f"{name}_tokens"] else np.zeros(0, dtype=dtype)
                for name in ("src", "tgt"))
        return self._sides

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_sides": None}

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt = self._open()
        s0, s1 = self.src_offsets[i], self.src_offsets[i + 1]
        t0, t1 = self.tgt_offsets[i], self.tgt_offsets[i + 1]
        return src[s0:s1], tgt[t0:t1]

    def texts(self, side: str) -> list[str]:
        """The cleaned text of one side (valid and test splits only)."""
        path = self.folder / f"{side}.txt"
        return path.read_text("utf-8").split("\n")[:-1] if path.exists() else []

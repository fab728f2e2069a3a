"""Reading parallel text through Hugging Face `datasets`, and cleaning it (I/O).

Every source becomes two aligned lists of strings, `src` and `tgt`. Supported sources
(see `CorpusConfig`): two line-aligned text files (plain or .gz), a TSV / JSONL / Parquet
file with source and target columns or a `translation` dict column, or a hub dataset
(name or local dataset folder) with a config and split.
"""

from __future__ import annotations

import csv
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from mtkit.atomic import write_failure
from mtkit.config import CorpusConfig

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)


def hf_datasets():
    """The `datasets` library, imported on first use (it takes a second to import, and
    `translate` never needs it), quiet unless debug logging is on."""
    import datasets

    datasets.disable_progress_bars()
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    datasets.logging.set_verbosity(logging.DEBUG if debug else logging.CRITICAL)
    return datasets

_FILE_BUILDERS = {".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """Unusable input data (one line naming the file)."""


@dataclass
class Pairs:
    """Aligned source and target sentences, and where they came from."""

    src: list[str]
    tgt: list[str]
    origin: str
    report: dict[str, int] = field(default_factory=dict)  # filter name -> pairs dropped

    def __len__(self) -> int:
        return len(self.src)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _load(builder: str, path: str, cache_dir: Path | None, **kwargs) -> datasets.Dataset:
    """`datasets.load_dataset` on one local file, turning its failures into a `DataError`."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file")
    try:
        return hf_datasets().load_dataset(builder, data_files={"x": path}, split="x",
                                     cache_dir=str(cache_dir) if cache_dir else None, **kwargs)
    except Exception as e:  # datasets wraps the reader's error; report the real one
        failure = write_failure(e, cache_dir)  # its cache is ours to write, not the input
        if failure is not None:
            raise failure from None
        cause = _root_cause(e)
        if isinstance(cause, UnicodeDecodeError):
            raise DataError(f"{path}: not valid UTF-8 (byte {cause.start} of a block: "
                            f"{cause.object[cause.start:cause.start + 4]!r})") from None
        raise DataError(f"{path}: cannot read ({type(cause).__name__}: "
                        f"{str(cause).splitlines()[0] if str(cause) else 'unknown error'})"
                        ) from None


def _text_lines(path: str, cache_dir: Path | None) -> list[str]:
    """A text file's lines; a UTF-8 byte-order mark at its start is dropped."""
    ds = _load("text", path, cache_dir, encoding="utf-8", encoding_errors="strict")
    lines = list(ds["text"])
    if lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    return lines


@contextmanager
def _hub_offline(offline: bool) -> Iterator[None]:
    """Run `datasets` with the hub's offline mode set to `offline` (restored after)."""
    import huggingface_hub.constants as hub

    datasets = hf_datasets()
    before = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = offline
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = before


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host answers a TCP connection within `timeout` seconds."""
    import huggingface_hub.constants as hub

    url = urlparse(hub.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(corpus: CorpusConfig, origin: str, cache_dir: Path | None) -> datasets.Dataset:
    """A hub dataset (or a local dataset folder): from the cache when it is there, else
    downloaded. Without a network it fails in seconds with one line, instead of retrying
    for half a minute."""
    def load() -> datasets.Dataset:
        return hf_datasets().load_dataset(corpus.hub, corpus.hub_config or None,
                                          split=corpus.split,
                                     cache_dir=str(cache_dir) if cache_dir else None)

    try:
        try:
            with _hub_offline(True):
                return load()
        except Exception:
            if Path(corpus.hub).exists():
                raise  # a local folder: the error is about it, not the network
        if not _hub_reachable():
            raise DataError(f"{origin}: not in the cache ({cache_dir}) and the hub cannot be "
                            f"reached (no network?)")
        return load()
    except DataError:
        raise
    except Exception as e:
        failure = write_failure(e, cache_dir)
        if failure is not None:
            raise failure from None
        cause = _root_cause(e)
        raise DataError(f"{origin}: cannot load dataset ({type(cause).__name__}: "
                        f"{str(cause).splitlines()[0] if str(cause) else ''})") from None


def _columns(ds: datasets.Dataset, corpus: CorpusConfig, src_lang: str, tgt_lang: str,
             origin: str) -> tuple[list[str], list[str]]:
    names = ds.column_names
    if "__index_level_0__" in names:  # pandas took a first column for the index
        raise DataError(f"{origin}: the first row has more tab-separated fields than the "
                        f"header; a tab inside a sentence? (columns would shift)")
    if corpus.src_col in names and corpus.tgt_col in names:
        return list(ds[corpus.src_col]), list(ds[corpus.tgt_col])
    if "translation" in names:
        rows = ds["translation"]
        try:
            return [r[src_lang] for r in rows], [r[tgt_lang] for r in rows]
        except (KeyError, TypeError):
            first = rows[0] if len(rows) else {}
            keys = sorted(first) if isinstance(first, dict) else first
            raise DataError(f"{origin}: the translation column has keys {keys}, not "
                            f"data.src_lang={src_lang!r} and data.tgt_lang={tgt_lang!r}") from None
    raise DataError(f"{origin}: no columns {corpus.src_col!r} and {corpus.tgt_col!r} "
                    f"(nor 'translation'); it has {names}")


def _as_str(values: list, origin: str) -> list[str]:
    out = []
    for i, v in enumerate(values):
        if v is None:
            v = ""
        if not isinstance(v, str):
            raise DataError(f"{origin}: row {i + 1} is {type(v).__name__}, not text")
        out.append(v)
    return out


def load_pairs(corpus: CorpusConfig, src_lang: str, tgt_lang: str,
               cache_dir: Path | None = None) -> Pairs:
    """Read one split as aligned pairs. A line-count mismatch is a `DataError`."""
    if corpus.src:
        src = _text_lines(corpus.src, cache_dir)
        tgt = _text_lines(corpus.tgt, cache_dir)
        if len(src) != len(tgt):
            raise DataError(f"line counts differ: {corpus.src} has {len(src)} lines, "
                            f"{corpus.tgt} has {len(tgt)}")
        return Pairs(src, tgt, f"{corpus.src} + {corpus.tgt}")
    if corpus.path:
        origin = corpus.path
        suffix = Path(corpus.path.removesuffix(".gz")).suffix.lower()
        builder = _FILE_BUILDERS.get(suffix)
        if builder is None:
            raise DataError(f"{origin}: unknown file type {suffix!r}; use .tsv, .jsonl "
                            f"or .parquet (or src/tgt for two text files)")
        extra = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if builder == "csv" else {}
        ds = _load(builder, corpus.path, cache_dir, **extra)
    elif corpus.hub:
        origin = f"{corpus.hub}" + (f"/{corpus.hub_config}" if corpus.hub_config else "")
        origin += f" [{corpus.split}]"
        ds = _load_hub(corpus, origin, cache_dir)
    else:
        raise DataError("no data given for this split")
    src, tgt = _columns(ds, corpus, src_lang, tgt_lang, origin)
    return Pairs(_as_str(src, origin), _as_str(tgt, origin), origin)


def clean_pairs(pairs: Pairs, dedup: bool = False) -> Pairs:
    """Strip whitespace, drop pairs with an empty side and (optionally) exact duplicates.

    Length filters need subword counts and run at encoding time (`data/shards.py`).
    """
    src, tgt = [], []
    report = {"empty": 0, "duplicate": 0}
    seen: set[tuple[str, str]] = set()
    for s, t in zip(pairs.src, pairs.tgt, strict=True):
        s, t = " ".join(s.split()), " ".join(t.split())  # strip, collapse inner whitespace
        if not s or not t:
            report["empty"] += 1
            continue
        if dedup:
            if (s, t) in seen:
                report["duplicate"] += 1
                continue
            seen.add((s, t))
        src.append(s)
        tgt.append(t)
    return Pairs(src, tgt, pairs.origin, {**pairs.report, **report})

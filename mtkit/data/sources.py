"""Reading parallel text as a stream of chunks, and cleaning it (I/O).

Every source is opened as a `Corpus`: its size is known before a pair is read (so that
line counts are checked before anything is written), and it yields chunks of aligned
source and target strings, so that no stage holds a whole corpus in memory. Supported
sources (see `CorpusConfig`): two line-aligned text files (plain or .gz), streamed line
by line; a TMX translation memory (plain or .gz), streamed unit by unit through lxml with
entities, DTDs and the network left alone; a TSV / JSONL / Parquet file with source and
target columns or a `translation` dict column, or a hub dataset (name or local dataset
folder) with a config and split, both read through Hugging Face `datasets`, whose Arrow
files are memory-mapped.

Cleaning is per chunk (`clean`); exact duplicates are found by a 64-bit hash of the
cleaned pair (`pair_hashes`, `SeenHashes`), so dedup keeps 8 bytes per pair, not the text.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import html
import logging
import re
import socket
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice, zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlparse

import numpy as np

from mtkit.core.atomic import reason, write_failure
from mtkit.core.config import CorpusConfig, DataConfig
from mtkit.core.errors import UserError, plural
from mtkit.core.languages import direction, source_tag, target_tag
from mtkit.core.textio import line_count

if TYPE_CHECKING:
    import datasets
    from lxml import etree

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


class DataError(UserError, ValueError):
    """Unusable input data (one line naming the file)."""


CHUNK_PAIRS = 10_000  # pairs per chunk: large enough to batch, small enough to stream

Chunk = tuple[list[str], list[str]]  # aligned source and target sentences


@dataclass(frozen=True)
class Corpus:
    """One opened corpus: where it came from, how many raw pairs it has (before
    cleaning), its weight (times its pairs are repeated) and its chunks, read on demand."""

    origin: str
    size: int
    weight: int
    _read: Callable[[int], Iterator[Chunk]]

    def chunks(self, size: int = CHUNK_PAIRS) -> Iterator[Chunk]:
        """The corpus's pairs in order, `size` at a time (the last chunk may be shorter)."""
        return self._read(size)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _load(builder: str, path: str, cache_dir: Path | None, **kwargs) -> datasets.Dataset:
    """`datasets.load_dataset` on one local file, turning its failures into a `DataError`."""
    if not Path(path).is_file():
        raise DataError(f"{path}: no such file")
    try:
        return hf_datasets().load_dataset(
            builder,
            data_files={"x": path},
            split="x",
            cache_dir=str(cache_dir) if cache_dir else None,
            **kwargs,
        )
    except Exception as e:  # datasets wraps the reader's error; report the real one
        failure = write_failure(e, cache_dir)  # its cache is ours to write, not the input
        if failure is not None:
            raise failure from None
        cause = _root_cause(e)
        if isinstance(cause, UnicodeDecodeError):
            raise DataError(
                f"{path}: not valid UTF-8 (byte {cause.start} of a block: "
                f"{cause.object[cause.start : cause.start + 4]!r})"
            ) from None
        raise DataError(
            f"{path}: cannot read ({type(cause).__name__}: "
            f"{str(cause).splitlines()[0] if str(cause) else 'unknown error'})"
        ) from None


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
        return hf_datasets().load_dataset(
            corpus.hub,
            corpus.hub_config or None,
            split=corpus.split,
            cache_dir=str(cache_dir) if cache_dir else None,
        )

    try:
        try:
            with _hub_offline(True):
                return load()
        except Exception:
            if Path(corpus.hub).exists():
                raise  # a local folder: the error is about it, not the network
        if not _hub_reachable():
            raise DataError(
                f"{origin}: not in the cache ({cache_dir}) and the hub cannot be "
                f"reached (no network?)"
            )
        return load()
    except DataError:
        raise
    except Exception as e:
        failure = write_failure(e, cache_dir)
        if failure is not None:
            raise failure from None
        cause = _root_cause(e)
        raise DataError(
            f"{origin}: cannot load dataset ({type(cause).__name__}: "
            f"{str(cause).splitlines()[0] if str(cause) else ''})"
        ) from None


# --- two line-aligned text files, streamed -------------------------------------------

_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def _open_bytes(path: str) -> BinaryIO:
    try:
        return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({reason(e)})") from None


def _lines_before_failure(path: str) -> int:
    """How many whole lines a file gives before it fails to read: it is read again, line
    by line, up to the failure being reported."""
    lines = 0
    try:
        with _open_bytes(path) as f:
            for _ in f:
                lines += 1
    except (*_GZIP_ERRORS, OSError):
        return lines  # the same failure, met again where it lies
    return lines  # read through this time: the failure was not in the data


def _read_failure(path: str, e: Exception) -> DataError:
    """A one-line error for a file that failed while being read, naming the line."""
    lines = _lines_before_failure(path)
    if isinstance(e, _GZIP_ERRORS):
        detail = str(e) or type(e).__name__
        return DataError(f"{path}: corrupt or truncated gzip data at line {lines + 1} ({detail})")
    return DataError(f"{path}: cannot read at line {lines + 1} ({reason(e)})")


def count_lines(path: str) -> int:
    """Lines in a text file (plain or .gz) as `_text_chunks` reads them (`line_count`).
    Errors name the file and the line."""
    with _open_bytes(path) as f:
        try:
            return line_count(f)
        except (*_GZIP_ERRORS, OSError) as e:
            raise _read_failure(path, e) from None


def _decode(lines: list[bytes], path: str, first_line: int) -> list[str]:
    try:
        return [x.decode("utf-8").removesuffix("\n") for x in lines]
    except UnicodeDecodeError:
        for i, x in enumerate(lines):
            try:
                x.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}: line {first_line + i} is not valid UTF-8 (byte "
                    f"{e.start}: {x[e.start : e.start + 4]!r})"
                ) from None
        raise


def _text_chunks(path: str, size: int) -> Iterator[list[str]]:
    """A text file's lines, `size` at a time; a UTF-8 byte-order mark at its start is
    dropped. Errors name the file and the line."""
    done = 0
    with _open_bytes(path) as f:
        while True:
            try:
                raw = list(islice(f, size))
            except (*_GZIP_ERRORS, OSError) as e:
                raise _read_failure(path, e) from None
            if not raw:
                return
            lines = _decode(raw, path, done + 1)
            if done == 0:
                lines[0] = lines[0].removeprefix("\ufeff")
            done += len(lines)
            yield lines


def _open_text_pair(corpus: CorpusConfig) -> Corpus:
    n_src, n_tgt = count_lines(corpus.src), count_lines(corpus.tgt)
    if n_src != n_tgt:
        raise DataError(
            f"line counts differ: {corpus.src} has {plural(n_src, 'line')}, "
            f"{corpus.tgt} has {n_tgt}"
        )

    def read(size: int) -> Iterator[Chunk]:
        for src, tgt in zip_longest(
            _text_chunks(corpus.src, size), _text_chunks(corpus.tgt, size), fillvalue=[]
        ):
            if len(src) != len(tgt):
                raise DataError(f"{corpus.src} and {corpus.tgt} changed while being read")
            yield src, tgt

    return Corpus(f"{corpus.src} + {corpus.tgt}", n_src, corpus.weight, read)


# --- TMX translation memories, streamed unit by unit ----------------------------------

_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
# Inline codes whose content is the original format's code (or, for sub, a text of its
# own, such as an attribute's): left out of the sentence; hi's content is the sentence's.
_NATIVE_CODES = frozenset({"bpt", "ept", "it", "ph", "ut", "sub"})
_LANGUAGES_NAMED = 8  # languages an error lists
_SCAN_BLOCK = 1 << 20  # bytes per read of the quick count
# A unit's start tag, or the start of markup a "<tu" could hide in (comment, CDATA,
# DOCTYPE, processing instruction)
_UNIT_OR_HIDING = re.compile(rb"<(?:tu[\s/>]|[!?])")


def _lxml_etree():
    """lxml's etree, imported on first use; missing, one line naming the extra."""
    try:
        from lxml import etree
    except ImportError:
        raise DataError("reading a TMX file needs lxml: pip install 'mtkit[tmx]'") from None
    return etree


class _LanguageMatch:
    """How well a tuv's language (xml:lang, or TMX 1.1's lang) matches the corpus's source
    and target codes: 2 the same code, 1 a region of it (`en` for `en-US`), 0 neither;
    case does not matter and `_` counts as `-`. Remembered per distinct language (a
    bounded number of them: a file that names more is matched afresh)."""

    REMEMBERED = 1024

    def __init__(self, src_lang: str, tgt_lang: str):
        self.codes = (self._normal(src_lang), self._normal(tgt_lang))
        self._known: dict[str, tuple[int, int]] = {}

    @staticmethod
    def _normal(code: str) -> str:
        return code.lower().replace("_", "-")

    def __call__(self, lang: str) -> tuple[int, int]:
        ranks = self._known.get(lang)
        if ranks is None:
            normal = self._normal(lang)
            ranks = tuple(
                2 if normal == code else int(normal.startswith(code + "-")) for code in self.codes
            )
            if len(self._known) < self.REMEMBERED:
                self._known[lang] = ranks
        return ranks


def _seg_text(seg: etree._Element) -> str:
    """A seg's sentence: its text and hi's, without the inline codes' native code (nor
    an entity the file declares itself, which is never expanded)."""
    if not len(seg):
        return seg.text or ""
    parts = [seg.text or ""]
    for child in seg:
        if isinstance(child.tag, str) and child.tag not in _NATIVE_CODES:
            parts.append(_seg_text(child))  # hi, or an element TMX does not name
        parts.append(child.tail or "")
    return "".join(parts)


def _seg_markup(seg: etree._Element) -> str:
    """A seg as the file writes it: text XML-escaped, inline codes as their elements."""
    etree = _lxml_etree()
    text = html.escape(seg.text or "", quote=False)
    return text + "".join(etree.tostring(c, encoding="unicode", with_tail=True) for c in seg)


def _quick_unit_count(f: BinaryIO) -> int | None:
    """The units of a TMX file, counted as its `<tu` start tags in the bytes (about 10
    times faster than parsing). Exact where no `<tu` can hide outside an element: a file
    in an ASCII-compatible encoding whose only markup besides elements is the XML
    declaration and a DOCTYPE without an internal subset. Any other file (a comment, a
    CDATA section, a processing instruction, an internal subset, UTF-16, a root that is not
    <tmx>): None."""
    head = f.read(_SCAN_BLOCK).removeprefix(b"\xef\xbb\xbf")
    if not head.startswith(b"<"):
        return None  # not ASCII-compatible (UTF-16), or not XML at all: lxml tells
    if head.startswith(b"<?xml"):
        end = head.find(b"?>")
        if end < 0:
            return None
        head = head[end + 2 :]
    doctype = head.find(b"<!DOCTYPE")
    if doctype >= 0:
        end = head.find(b">", doctype)
        if end < 0 or b"[" in head[doctype:end]:
            return None
        head = head[:doctype] + head[end + 1 :]
    if not re.match(rb"\s*<tmx[\s/>]", head):
        return None  # not a TMX file, or the root is not in the first block: lxml tells
    units, tail, block = 0, b"", head
    while block:
        scan = tail + block  # a tag across two blocks is found once, here
        found = _UNIT_OR_HIDING.findall(scan)
        if b"<!" in found or b"<?" in found:
            return None
        units += len(found)
        tail, block = scan[-3:], f.read(_SCAN_BLOCK)
    return units


class TmxReader:
    """One TMX file read as a stream of its units (`tu`): each unit is parsed, used and
    cleared, and the units before it dropped, so memory stays flat at any size.

    The file is a stranger's: lxml reads it with no entity expanded (`resolve_entities`
    off: a DOCTYPE's entities, external or not, are neither fetched nor expanded), no DTD
    loaded, no network, and libxml2's default bounds on depth and text size (no
    `huge_tree`). A unit gives one pair: for each side, the tuv whose language is the
    corpus's (`_LanguageMatch`: the same code before a region of it, then the first);
    a side it lacks is "" (cleaning then drops and counts the pair, as any empty side).
    `inline`: "strip" or "keep" the inline codes (`CorpusConfig.tmx_inline`)."""

    def __init__(self, path: str, src_lang: str, tgt_lang: str, inline: str = "strip"):
        self.path = path
        self.langs = (src_lang, tgt_lang)
        self.match = _LanguageMatch(src_lang, tgt_lang)
        self.text = _seg_markup if inline == "keep" else _seg_text

    def count(self) -> int:
        """The units in the file: their start tags counted in the bytes where that is
        exact (`_quick_unit_count`), else the file parsed."""
        try:
            with _open_bytes(self.path) as f:
                units = _quick_unit_count(f)
        except _GZIP_ERRORS:
            units = None  # parsed below, which names the line
        except OSError as e:
            raise DataError(f"{self.path}: cannot read ({reason(e)})") from None
        return sum(1 for _ in self.units()) if units is None else units

    def units(self) -> Iterator[etree._Element]:
        """Every `tu`, whole, in order; a unit is cleared once the next one is asked for.
        Malformed XML and damaged gzip data are one line naming the file and the line."""
        etree = _lxml_etree()
        line = 0  # where the last unit started
        with _open_bytes(self.path) as f:
            parsed = etree.iterparse(
                f,
                events=("end",),
                tag="tu",
                resolve_entities=False,
                no_network=True,
                load_dtd=False,
                huge_tree=False,
                remove_comments=True,
                remove_pis=True,
            )
            try:
                for _, tu in parsed:
                    line = tu.sourceline or line
                    yield tu
                    tu.clear()
                    while tu.getprevious() is not None:
                        del tu.getparent()[0]
                root = parsed.root
            except etree.XMLSyntaxError as e:
                raise DataError(
                    f"{self.path}: malformed XML at {_first_error(parsed, e)}"
                ) from None
            except _GZIP_ERRORS as e:
                raise DataError(
                    f"{self.path}: corrupt or truncated gzip data after line {line} "
                    f"({str(e) or type(e).__name__})"
                ) from None
            except OSError as e:
                raise DataError(
                    f"{self.path}: cannot read after line {line} ({reason(e)})"
                ) from None
        if root is None or root.tag != "tmx":
            name = root.tag if root is not None and isinstance(root.tag, str) else "?"
            raise DataError(
                f"{self.path}: not a TMX file (its root element is <{name}>, not <tmx>)"
            )

    def pairs(self) -> Iterator[tuple[str, str]]:
        """(source, target) for each unit, "" for a side it lacks. Once every unit is
        read, a file with no text at all in one of the two languages is a `DataError`
        naming the languages it has."""
        match, text = self.match, self.text
        found = [False, False]
        named: list[str] = []
        for tu in self.units():
            src = tgt = None
            src_rank = tgt_rank = 0
            for tuv in tu:
                if tuv.tag != "tuv":
                    continue  # a prop or note of the unit
                lang = tuv.get(_XML_LANG) or tuv.get("lang") or ""
                a, b = match(lang)
                if a > src_rank:
                    src, src_rank = tuv, a
                if b > tgt_rank:
                    tgt, tgt_rank = tuv, b
                if len(named) < _LANGUAGES_NAMED and lang not in named:
                    named.append(lang)
            src, tgt = _seg(src), _seg(tgt)
            found[0] = found[0] or src is not None
            found[1] = found[1] or tgt is not None
            yield "" if src is None else text(src), "" if tgt is None else text(tgt)
        for key, code, seen in zip(("src_lang", "tgt_lang"), self.langs, found, strict=True):
            if named and not seen:
                raise DataError(
                    f"{self.path}: no unit has a text in {code!r} (data.{key}); its "
                    f"languages: {', '.join(named)}"
                )


def _first_error(parsed: etree.iterparse, e: etree.XMLSyntaxError) -> str:
    """ "line N: what" of the parser's first error (the exception iterparse raises may
    only say "no element found")."""
    first = next(iter(parsed.error_log.filter_from_errors()), None)
    line, what = (first.line, first.message) if first else (e.lineno, e.msg or "syntax error")
    return f"line {max(line, 1)}: {what.splitlines()[0] if what else 'syntax error'}"


def _seg(tuv: etree._Element | None) -> etree._Element | None:
    """A tuv's seg (its last child, after any notes and props), or None."""
    if tuv is None or not len(tuv):
        return None
    last = tuv[-1]
    return last if last.tag == "seg" else next(tuv.iterchildren("seg"), None)


def _open_tmx(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> Corpus:
    reader = TmxReader(corpus.path, src_lang, tgt_lang, corpus.tmx_inline)
    units = reader.count()

    def read(size: int) -> Iterator[Chunk]:
        pairs, done = reader.pairs(), 0
        while batch := list(islice(pairs, size)):
            done += len(batch)
            if done > units:
                break
            src, tgt = zip(*batch, strict=True)
            yield list(src), list(tgt)
        if done != units:
            raise DataError(
                f"{corpus.path}: {plural(units, 'unit')} counted, {done} read "
                f"(the file changed while being read?)"
            )

    return Corpus(corpus.path, units, corpus.weight, read)


# --- tables (TSV, JSONL, Parquet, hub datasets), through memory-mapped Arrow ----------


def _table_columns(
    ds: datasets.Dataset, corpus: CorpusConfig, src_lang: str, tgt_lang: str, origin: str
) -> Callable[[dict], Chunk]:
    """Check the columns once; returns how to take (src, tgt) out of a batch of rows."""
    names = ds.column_names
    if "__index_level_0__" in names:  # pandas took a first column for the index
        raise DataError(
            f"{origin}: the first row has more tab-separated fields than the "
            f"header; a tab inside a sentence? (columns would shift)"
        )
    if corpus.src_col in names and corpus.tgt_col in names:
        return lambda batch: (batch[corpus.src_col], batch[corpus.tgt_col])
    if "translation" not in names:
        raise DataError(
            f"{origin}: no columns {corpus.src_col!r} and {corpus.tgt_col!r} "
            f"(nor 'translation'); it has {names}"
        )

    def split(batch: dict) -> Chunk:
        rows = batch["translation"]
        try:
            return [r[src_lang] for r in rows], [r[tgt_lang] for r in rows]
        except (KeyError, TypeError):
            first = rows[0] if rows else {}
            keys = sorted(first) if isinstance(first, dict) else first
            raise DataError(
                f"{origin}: the translation column has keys {keys}, not "
                f"data.src_lang={src_lang!r} and data.tgt_lang={tgt_lang!r}"
            ) from None

    return split


def _as_str(values: list, origin: str, first_row: int) -> list[str]:
    for i, v in enumerate(values):
        if not isinstance(v, str):
            if v is not None:
                raise DataError(f"{origin}: row {first_row + i} is {type(v).__name__}, not text")
            values[i] = ""
    return values


def _open_table(
    corpus: CorpusConfig, src_lang: str, tgt_lang: str, cache_dir: Path | None
) -> Corpus:
    if corpus.path:
        origin = corpus.path
        suffix = Path(corpus.path.removesuffix(".gz")).suffix.lower()
        builder = _FILE_BUILDERS.get(suffix)
        if builder is None:
            raise DataError(
                f"{origin}: unknown file type {suffix!r}; use .tsv, .jsonl, "
                f".parquet or .tmx (or src/tgt for two text files)"
            )
        extra = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if builder == "csv" else {}
        ds = _load(builder, corpus.path, cache_dir, **extra)
    else:
        origin = f"{corpus.hub}" + (f"/{corpus.hub_config}" if corpus.hub_config else "")
        origin += f" [{corpus.split}]"
        ds = _load_hub(corpus, origin, cache_dir)
    columns = _table_columns(ds, corpus, src_lang, tgt_lang, origin)
    if len(ds):
        columns(ds[:1])  # a translation column without the languages fails now, not later

    def read(size: int) -> Iterator[Chunk]:
        for start in range(0, len(ds), size):
            src, tgt = columns(ds[start : start + size])
            yield _as_str(src, origin, start + 1), _as_str(tgt, origin, start + 1)

    return Corpus(origin, len(ds), corpus.weight, read)


def _refuse_a_pipe(path: str | None) -> None:
    """A corpus is read more than once (its lines counted before they are encoded, and
    by `mtkit tokenizer` before `mtkit preprocess`): a pipe (`<(...)`, a FIFO) or a
    device would give its lines to the first reading only."""
    if path and Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir():
        raise DataError(
            f"{path} is a pipe or a device, not a file: a corpus is read more "
            f"than once (counted, then encoded); save it to a file first"
        )


def open_corpus(
    corpus: CorpusConfig, src_lang: str, tgt_lang: str, cache_dir: Path | None = None
) -> Corpus:
    """Open one corpus: check that it can be read and count its pairs (a line-count
    mismatch between two text files is a `DataError` here, before anything is read)."""
    for path in (corpus.src, corpus.tgt, corpus.path):
        _refuse_a_pipe(path)
    if corpus.src:
        return _open_text_pair(corpus)
    if corpus.tmx:
        return _open_tmx(corpus, src_lang, tgt_lang)
    if corpus.path or corpus.hub:
        return _open_table(corpus, src_lang, tgt_lang, cache_dir)
    raise DataError("no data given for this split")


def open_split(
    cfg: DataConfig, split: str, cache_dir: Path | None = None, lang_tag: str = "source"
) -> list[Corpus]:
    """Every corpus of a split, opened (empty when the split is not set), each in its
    own languages; in a multilingual run each source line (or with `lang_tag: target`
    each target line) starts with its target's tag (`mtkit.core.languages`)."""
    return [
        tagged(
            open_corpus(c, *direction(c, cfg), cache_dir),
            source_tag(c, cfg, lang_tag),
            target_tag(c, cfg, lang_tag),
        )
        for c in cfg.corpora(split)
    ]


def tagged(corpus: Corpus, prefix: str, target_prefix: str = "") -> Corpus:
    """The corpus with `prefix` before each source line and `target_prefix` before each
    target line ("" and "": the corpus itself)."""
    if not prefix and not target_prefix:
        return corpus

    def read(size: int) -> Iterator[Chunk]:
        for src, tgt in corpus.chunks(size):
            yield (
                [prefix + x if x else x for x in src],
                [target_prefix + y if y else y for y in tgt],
            )

    return dataclasses.replace(corpus, _read=read)


# --- cleaning and exact-duplicate removal --------------------------------------------


def clean(src: list[str], tgt: list[str]) -> tuple[list[str], list[str], np.ndarray]:
    """Strip and collapse whitespace on both sides; returns the cleaned sides and the
    mask of pairs to keep (both sides non-empty). Length filters need subword counts and
    run at encoding time (`data/shards.py`)."""
    src = [" ".join(x.split()) for x in src]
    tgt = [" ".join(x.split()) for x in tgt]
    keep = np.fromiter(
        (bool(s) and bool(t) for s, t in zip(src, tgt, strict=True)), dtype=bool, count=len(src)
    )
    return src, tgt, keep


def pair_hashes(src: list[str], tgt: list[str]) -> np.ndarray:
    """A 64-bit hash of each cleaned pair (BLAKE2b, so the same in every process and run).
    Cleaned sentences hold no tab, so "src<TAB>tgt" is unambiguous."""
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8).digest(), "little")
            for s, t in zip(src, tgt, strict=True)
        ),
        dtype=np.uint64,
        count=len(src),
    )


class SeenHashes:
    """The set of pair hashes seen so far, as a few sorted uint64 arrays (8 bytes a pair).

    Arrays are merged like the digits of a binary counter, so there are O(log n) of them
    and each hash is merged O(log n) times."""

    def __init__(self) -> None:
        self._levels: list[np.ndarray] = []  # sorted, largest first

    def __len__(self) -> int:
        return sum(len(x) for x in self._levels)

    def first_seen(self, hashes: np.ndarray) -> np.ndarray:
        """Mask of the hashes never seen before (a repeat within `hashes` counts as seen
        after its first place); adds them to the set."""
        new = np.zeros(len(hashes), dtype=bool)
        new[np.unique(hashes, return_index=True)[1]] = True
        for level in self._levels:
            pos = np.minimum(np.searchsorted(level, hashes), len(level) - 1)
            new &= level[pos] != hashes
        added = np.sort(hashes[new])
        while self._levels and len(self._levels[-1]) <= len(added):
            added = np.sort(np.concatenate([self._levels.pop(), added]), kind="stable")
        if len(added):
            self._levels.append(added)
        return new

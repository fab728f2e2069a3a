"""Text in, text out: load a translator, stream lines, batch by length, restore order.

The translator is `mtkit.native.Translator` for checkpoints (PyTorch) or
`mtkit.ct2.CT2Translator` for an exported folder; this module imports neither until
`load_translator` chooses one, so translating with an exported folder never loads torch.

`translate_stream` reads whatever lines are available (so it works interactively and
in a pipe), translates them in length-sorted batches of at most `batch_tokens` / beam
source tokens (the search carries beam rows per sentence), and writes exactly one
output line per input line (n lines with `nbest` n), in input order, flushed after
each chunk. Empty lines give empty lines without
running the model; invalid UTF-8 is replaced, not fatal; a byte-order mark at the start
is dropped; a line longer than the model's positions is truncated with one warning, and
memory per line stays bounded: bytes beyond `MAX_LINE_BYTES` are dropped while reading.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal, TextIO

from mtkit.config import MAX_COUNT, DecodeConfig
from mtkit.errors import OptionError, plural
from mtkit.hypothesis import Hypothesis, pharaoh
from mtkit.vocab import Vocab

if TYPE_CHECKING:
    from mtkit.ct2 import CT2Translator
    from mtkit.native import LineStream, Translator

log = logging.getLogger(__name__)

CHUNK_LINES = 2000  # most lines translated (and sorted by length) together
# Longest input line kept, in bytes. A subword is at least one byte, so this is far more
# than any model's positions (1,024 by default); it only bounds memory on a runaway line.
MAX_LINE_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class DecodeOptions:
    beam: int = 5
    lenpen: float = 0.6
    max_len_a: float = 1.2  # output limit a * src_len + b, never past the model's positions
    max_len_b: int = 10
    batch_tokens: int = 8000  # source tokens x beam (the rows the search carries) per batch
    nbest: int = 1
    scores: bool = False
    format: Literal["text", "jsonl"] = "text"
    no_repeat_ngram: int = 0  # 0: off
    sampling: bool = False  # draw `beam` samples per sentence instead of searching
    temperature: float = 1.0
    topk: int = 0  # 0: all tokens
    topp: float = 1.0
    seed: int = 1
    alignments: bool = False  # word alignments from cross-attention, in Pharaoh format
    align_layer: int | None = None  # None: the second-to-last decoder layer

    @classmethod
    def from_config(cls, cfg: DecodeConfig, **overrides) -> DecodeOptions:
        base = {"beam": cfg.beam, "lenpen": cfg.lenpen, "max_len_a": cfg.max_len_a,
                "max_len_b": cfg.max_len_b, "batch_tokens": cfg.batch_tokens}
        given = {k: v for k, v in overrides.items() if v is not None}
        for name, (lowest, highest) in OPTION_RANGES.items():
            value = given.get(name)
            if value is not None and not (_finite(value) and lowest <= value
                                          and (highest is None or value <= highest)):
                span = (f"at least {lowest}" if highest is None
                        else f"from {lowest} to {_number(highest)}")
                raise OptionError(f"--{name.replace('_', '-')} must be {span}, got {value}")
        for name, check, span in (("temperature", lambda t: t > 0, "above 0"),
                                  ("topp", lambda p: 0 < p <= 1, "in (0, 1]")):
            value = given.get(name)
            if value is not None and not (_finite(value) and check(value)):
                raise OptionError(f"--{name} must be {span}, got {value}")
        opts = cls(**{**base, **given})
        if not opts.sampling:
            for name in ("temperature", "topk", "topp", "seed"):
                if name in given:
                    raise OptionError(f"--{name} is a sampling option: add --sampling")
        if "align_layer" in given and not opts.alignments:
            raise OptionError("--align-layer chooses where alignments come from: add "
                              "--alignments")
        if opts.nbest > opts.beam:
            beam = "--beam" if "beam" in given else "the checkpoint's beam size"
            raise OptionError(f"--nbest {opts.nbest} must not exceed {beam} {opts.beam}")
        return opts


_DECODE = {f.name: f.metadata for f in fields(DecodeConfig)}
# The range of each numeric option (None: no upper bound; a huge length limit means the
# model's positions, a huge top-k all tokens). The highest beam, length penalty and
# batch are decode.*'s in the config; counts stay within what CTranslate2's C++ holds.
OPTION_RANGES = {
    "beam": (1, _DECODE["beam"]["hi"]), "lenpen": (0, _DECODE["lenpen"]["hi"]),
    "max_len_a": (0, None), "max_len_b": (0, None),
    "batch_tokens": (1, _DECODE["batch_tokens"]["hi"]), "nbest": (1, _DECODE["beam"]["hi"]),
    "no_repeat_ngram": (1, MAX_COUNT), "topk": (0, None), "seed": (0, None),
    "align_layer": (0, None),
}


def _number(value: float) -> str:
    """A range's bound as a user reads it: 10, 2,147,483,647, 0.5."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _finite(value: float) -> bool:
    """Whether a number is finite (an int of any size is; `math.isfinite` cannot take
    one beyond a float's range)."""
    return isinstance(value, int) or math.isfinite(value)


class Frontend:
    """What every translator does to its input before the search: set empty lines
    aside, encode and truncate the others, encode target prefixes. Needs `src_vocab`,
    `tgt_vocab`, `max_positions` and `_truncated` (the kinds of text already warned
    about); subclasses search in `translate`."""

    src_vocab: Vocab
    tgt_vocab: Vocab
    _truncated: set[str]
    can_align = True  # whether `translate` honours `opts.alignments`

    def describe(self) -> dict:
        """What runs the search, for `mtkit serve`'s /v1/info: engine, models,
        parameters (None where unknown)."""
        raise NotImplementedError

    def translate(self, lines: list[str], opts: DecodeOptions,
                  done: Callable[[int], None] | None = None,
                  prefixes: list[str] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses for each line, in input order; empty lines get one empty one."""
        raise NotImplementedError

    def stream(self, opts: DecodeOptions) -> LineStream | None:
        """A continuous-batching stream for these options (`mtkit.native.LineStream`:
        lines join a running search and leave it as they end), or None where this
        translator has none for them: then `translate` them in rounds."""
        return None

    @property
    def max_src_tokens(self) -> int:
        return self.max_positions - 1  # room for eos

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self._cut(self.src_vocab.encode(lines), self.max_src_tokens, "input lines")

    def _cut(self, ids: list[list[int]], limit: int, what: str) -> list[list[int]]:
        """Each of `ids` cut to `limit` pieces; the first cut of each kind is logged."""
        if all(len(x) <= limit for x in ids):
            return ids
        if what not in self._truncated:
            log.warning("%s longer than %d subwords are truncated (model.max_positions=%d)",
                        what, limit, self.max_positions)
            self._truncated.add(what)
        return [x[:limit] for x in ids]

    def prepare(self, lines: list[str], opts: DecodeOptions, done: Callable[[int], None],
                prefixes: list[str] | None
                ) -> tuple[list[list[Hypothesis]], list[int], list[list[int]],
                           list[list[int]] | None]:
        """Empty lines answered (an empty hypothesis each; `done` is told), the others
        encoded: the results so far, the indices of the lines left, their source ids
        and their target prefix ids (None without prefixes)."""
        out: list[list[Hypothesis]] = [[] for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        empty = [Hypothesis([], 0.0, 0.0, () if opts.alignments else None)] * opts.nbest
        for i in set(range(len(lines))) - set(todo):
            out[i] = empty
        done(len(lines) - len(todo))
        ids = self.encode([lines[i] for i in todo]) if todo else []
        forced = (self._cut(self.tgt_vocab.encode([prefixes[i] for i in todo]),
                            self.max_src_tokens - 1, "target prefixes")  # room for eos
                  if prefixes and todo else None)
        return out, todo, ids, forced


def line_seed(seed: int, line: str) -> int:
    """A sampling seed for one input line: from the user's seed and the line's text."""
    digest = hashlib.sha256(f"{seed}\0{line}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:7], "little")


def length_batches(order: list[int], ids: list[list[int]], batch_tokens: int
                    ) -> Iterator[list[int]]:
    """Consecutive runs of `order` with (rows x longest + 1) <= batch_tokens."""
    batch: list[int] = []
    longest = 0
    for k in order:
        n = len(ids[k]) + 1
        if batch and (len(batch) + 1) * max(longest, n) > batch_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(k)
        longest = max(longest, n)
    if batch:
        yield batch


def names_export(paths: Sequence[str | os.PathLike]) -> bool:
    """Whether `-m` names a folder (made by `mtkit export`) rather than checkpoint files:
    then CTranslate2 translates, and torch is never loaded."""
    return any(Path(p).is_dir() for p in paths)


def read_files(paths: Sequence[str | os.PathLike]) -> dict[str, list[Path]]:
    """Every file that loading `-m paths` reads, under the option's name ("--model",
    "--model #2", ...): a checkpoint file, or each file of an exported folder. An output
    must be none of them."""
    files = {}
    for i, p in enumerate(map(Path, paths)):
        files["--model" + (f" #{i + 1}" if i else "")] = (
            sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p])
    return files


def load_translator(paths: str | os.PathLike | Sequence[str | os.PathLike],
                    device: str = "auto", device_option: str = "--device"
                    ) -> Translator | CT2Translator:
    """The translator of checkpoint file(s) (several make an ensemble) or of a folder
    made by `mtkit export`. `device_option` names the option `device` came from, for
    the error when it cannot be used. Each backend is imported only when chosen: an
    exported folder is translated without loading torch."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if names_export(paths):
        return _load_export(paths, device, device_option)
    from mtkit.native import load_checkpoints

    return load_checkpoints(paths, device, device_option)


def _load_export(paths: list, device: str, device_option: str):
    """The CTranslate2 translator of an exported folder (`mtkit export`)."""
    from mtkit.ct2 import CT2Translator, is_export

    folder = next(Path(p) for p in paths if Path(p).is_dir())
    if not is_export(folder):
        raise OptionError(f"{folder} is a folder but not an exported model (no "
                              f"mtkit.json and model.bin); -m takes a checkpoint file or a "
                              f"folder made by mtkit export")
    if len(paths) > 1:
        raise OptionError("an ensemble needs checkpoints; an exported CTranslate2 folder "
                          "translates alone")
    return CT2Translator(folder, device, device_option)


def read_chunks(stream: BinaryIO, max_lines: int = CHUNK_LINES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[list[str]]:
    """Lines as they become available: each chunk holds the complete lines that one read
    returned (at most `max_lines`), so an interactive user gets each line translated at
    once and a pipe gets large batches. Invalid UTF-8 is replaced; a leading byte-order
    mark is dropped; a line keeps at most its first `max_line_bytes` bytes, cut while
    reading, so a huge line without newlines never sits whole in memory."""
    fd = _fileno(stream)
    pending = bytearray()  # the start of a line whose end has not been read yet
    at_start, warned = True, False

    def bounded(line: bytes) -> bytes:
        nonlocal warned
        if len(line) > max_line_bytes and not warned:
            log.warning("an input line is longer than %d bytes; only its start is "
                        "translated", max_line_bytes)
            warned = True
        return line[:max_line_bytes]

    while True:
        data = os.read(fd, 1 << 20) if fd is not None else stream.read(1 << 20)
        if not data:
            break
        if at_start:
            data, at_start = data.removeprefix(BOM), False
        *lines, rest = data.split(b"\n")
        if lines:
            lines[0] = bytes(pending) + lines[0]
            pending.clear()
        lines = [bounded(x) for x in lines]
        pending += rest[: max(max_line_bytes + 1 - len(pending), 0)]  # +1: still "too long"
        for start in range(0, len(lines), max_lines):
            yield [_decode(x) for x in lines[start : start + max_lines]]
    if pending:
        yield [_decode(bounded(bytes(pending)))]


def _fileno(stream) -> int | None:
    """The stream's OS file descriptor, or None for in-memory streams."""
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r")


@dataclass(frozen=True)
class Request:
    """One input line: the source text, an optional target prefix and, in jsonl, an
    optional `id` echoed back, or why the line could not be read."""

    src: str
    prefix: str = ""
    id: object = None
    error: str = ""


def parse_request(line: str, jsonl: bool) -> Request:
    """A text line is the source; a jsonl line is {"src": ..., "prefix"?: ...,
    "id"?: ...}. A malformed jsonl line becomes a `Request` with an error: not JSON,
    nested too deeply to parse, a number too long to read, text with a lone surrogate
    (an escape such as \\ud800 that is no character), or an `id` that is not text, a
    number or null (`check_id`)."""
    if not jsonl:
        return Request(line)
    try:
        record = read_json(line) if line.strip() else {"src": ""}
    except ValueError as e:
        return Request("", error=f"not a JSON object: {e}")
    if not isinstance(record, dict) or not isinstance(record.get("src"), str) or not \
            isinstance(record.get("prefix", ""), str):
        got = record if not isinstance(record, dict) else sorted(record)
        return Request("", id=_echoed_id(record),
                       error=f'expected {{"src": text, "prefix"?: text, "id"?: ...}}, '
                             f"got {_shown(got)}")
    id_error = check_id(record.get("id"))
    if id_error:
        return Request("", error=id_error)
    for name in ("src", "prefix"):
        bad = lone_surrogate(record.get(name, ""))
        if bad:
            return Request("", id=record.get("id"), error=f"{name}: {bad}")
    return Request(record["src"], record.get("prefix", ""), record.get("id"))


def read_json(text: str) -> object:
    """`json.loads`, with each way it fails as one ValueError that says why: a syntax
    error (and where), nesting too deep to parse, a number too long to read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise ValueError("a number has too many digits to read") from None


MAX_ID_CHARS = 1000  # the longest `id` echoed back


def check_id(value: object) -> str:
    """Why a jsonl line's `id` cannot be echoed back, or "" if it can: text of at most
    `MAX_ID_CHARS` characters (valid Unicode), an integer of at most 64 bits, a finite
    number, or null: never an object, a list or a boolean."""
    if value is None:
        return ""
    if isinstance(value, str):
        if len(value) > MAX_ID_CHARS:
            return f"id: text of at most {MAX_ID_CHARS} characters, got {len(value)}"
        bad = lone_surrogate(value)
        return f"id: {bad}" if bad else ""
    if isinstance(value, int) and not isinstance(value, bool):
        if -(1 << 63) <= value < 1 << 63:
            return ""
        return f"id: an integer of at most 64 bits, got one of {value.bit_length()} bits"
    if isinstance(value, float):
        return "" if math.isfinite(value) else f"id: a finite number, got {value}"
    return f"id: text, a number or null, got {type(value).__name__} {_shown(value)}"


def _echoed_id(record: object) -> object:
    """The record's `id` if it can be echoed back in its error record, else None."""
    if isinstance(record, dict) and not check_id(record.get("id")):
        return record.get("id")
    return None


def lone_surrogate(text: object) -> str:
    """Why `text` is not valid Unicode (a lone surrogate, from an escape such as
    \\ud800), or "" if it is (or is not text)."""
    if not isinstance(text, str):
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"a lone surrogate \\u{ord(text[e.start]):04x} at character {e.start} "
                f"is not a character")
    return ""


def _shown(value: object) -> str:
    """At most 80 characters of `value`, printable whatever it holds (a lone surrogate
    is escaped; a value nested too deeply is not shown)."""
    try:
        text = str(value)[:80]
    except RecursionError:
        return "(nested too deeply to show)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def format_lines(index: int, request: Request, hyps: list[Hypothesis], tgt_vocab: Vocab,
                 opts: DecodeOptions) -> list[str]:
    """The output lines of one input line (n of them with --nbest n in text format)."""
    if request.error:  # jsonl only: the line stays, as an error record
        return [json.dumps({"line": index, **({"id": request.id} if request.id is not None
                                              else {}), "error": request.error},
                           ensure_ascii=False)]
    texts = [tgt_vocab.decode(h.tokens) for h in hyps]
    links = [pharaoh(h.alignment or ()) for h in hyps]
    if opts.format == "jsonl":
        def entry(k: int) -> dict:
            return {"translation": texts[k], "score": round(hyps[k].score, 4),
                    **({"alignment": links[k]} if opts.alignments else {})}

        record = {"line": index, **({"id": request.id} if request.id is not None else {}),
                  "source": request.src, **entry(0)}
        if opts.nbest > 1:
            record["nbest"] = [entry(k) for k in range(len(hyps))]
        return [json.dumps(record, ensure_ascii=False)]
    if opts.nbest > 1:
        return [f"{index} ||| {t} ||| {h.score:.4f}" + (f" ||| {a}" if opts.alignments else "")
                for t, h, a in zip(texts, hyps, links, strict=True)]
    fields = [texts[0]] + ([f"{hyps[0].score:.4f}"] if opts.scores else []) \
        + ([links[0]] if opts.alignments else [])
    return ["\t".join(fields)]


def read_all_lines(source: BinaryIO, expected: int, what: str) -> BinaryIO:
    """All of `source` in memory, after checking that it has `expected` lines (as
    `read_chunks` counts them); `what` names the file it must match in the error."""
    data = source.read()
    lines = data.count(b"\n") + (not data.endswith(b"\n") and len(data) > 0)
    if lines != expected:
        raise OptionError(f"{what} has {plural(expected, 'line')}, the input has {lines}")
    return io.BytesIO(data)


def translate_stream(translator: Frontend, source: BinaryIO, sink: TextIO,
                     opts: DecodeOptions, done: Callable[[int], None] | None = None,
                     prefixes: list[str] | None = None) -> int:
    """Translate every line of `source` to `sink`; returns the number of input lines.
    In jsonl format the input lines are JSON records too (`parse_request`). `prefixes`:
    a target prefix for each input line (text format). `done(n)` is called as lines are
    finished (for a progress bar)."""
    count = 0
    for lines in read_chunks(source):
        requests = [parse_request(x, opts.format == "jsonl") for x in lines]
        chunk_prefixes = [r.prefix for r in requests]
        if prefixes is not None:
            chunk_prefixes = prefixes[count : count + len(lines)]
        results = translator.translate([r.src for r in requests], opts, done,
                                       chunk_prefixes if any(chunk_prefixes) else None)
        out = []
        for offset, (request, hyps) in enumerate(zip(requests, results, strict=True)):
            out.extend(format_lines(count + offset, request, hyps, translator.tgt_vocab,
                                    opts))
        sink.write("".join(x + "\n" for x in out))
        sink.flush()
        count += len(lines)
    return count


BAR_MIN_LINES = 300  # files shorter than this translate without a progress bar


@contextmanager
def progress_bar(path: str | os.PathLike | None, console=None
                 ) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar (lines done, sentences/s, ETA) for translating the file `path`,
    on stderr when it is a terminal and the file has at least `BAR_MIN_LINES` lines;
    yields the callback that advances it, or None. Never touches stdout."""
    if path is None:
        yield None
        return
    from rich.console import Console

    console = console or Console(file=sys.stderr)
    # (counting reads the file: never a pipe's, which the translation reads)
    total = _count_lines(path) if console.is_terminal and Path(path).is_file() else 0
    if total < BAR_MIN_LINES:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("translate"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                   console=console, redirect_stdout=False, redirect_stderr=False)
    task = bar.add_task("translate", total=total, rate="")
    start = time.perf_counter()

    def advance(n: int) -> None:
        done = bar.tasks[0].completed + n
        rate = done / max(time.perf_counter() - start, 1e-9)
        bar.update(task, completed=done, rate=f"{rate:,.1f} sentences/s")

    with bar:
        yield advance


def _count_lines(path: str | os.PathLike) -> int:
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def translate_texts(translator: Frontend, lines: list[str], opts: DecodeOptions) -> list[str]:
    """Best translation of each line, in order (for evaluation)."""
    hyps = translator.translate(lines, opts)
    return [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]

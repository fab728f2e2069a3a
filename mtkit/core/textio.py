"""Text in, text out: lines as they arrive, jsonl requests, output formats, order kept.

`translate_stream` reads whatever lines are available (so it works interactively and
in a pipe), hands each chunk to a translator (`mtkit.core.search_options.Translator`, which sorts
and batches it), and writes exactly one output line per input line (n lines with
`nbest` n), in input order, flushed after each chunk. Empty lines give empty lines
without running the model; invalid UTF-8 is replaced, not fatal; a byte-order mark at
the start is dropped; memory per line stays bounded: bytes beyond `MAX_LINE_BYTES` are
dropped while reading. In jsonl, each input line is a request record and each output
line a result record; a malformed record gets an error record, and the rest go on.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO, Literal, TextIO

from mtkit.core.errors import OptionError, plural
from mtkit.core.hypothesis import Hypothesis, pharaoh
from mtkit.core.languages import tag_ids, tagging, untagged
from mtkit.core.search_options import BATCH_TOKENS, SearchOptions, Translator, constraints_need
from mtkit.core.terms import Glossary, combine
from mtkit.core.vocab import Vocab

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip file
CHUNK_LINES = 2000  # most lines translated (and sorted by length) together
# Longest input line kept, in bytes. A subword is at least one byte, so this is far more
# than any model's positions (1,024 by default); it only bounds memory on a runaway line.
MAX_LINE_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"


def line_count(stream: BinaryIO) -> int:
    """Lines in a binary stream, read to its end in blocks, without decoding: a last line
    without its newline counts. The one line counter (corpora in `mtkit.data.sources`,
    translate's input here and its bar in `mtkit.core.progress`)."""
    lines, last = 0, b"\n"
    while block := stream.read(1 << 20):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


@dataclass(frozen=True)
class OutputFormat:
    """How results are written: `text` (the translation, then with `scores` a tab and
    the score, with alignments a tab and the links; n-best as 'i ||| text ||| score'),
    or `jsonl` (one record per input line)."""

    kind: Literal["text", "jsonl"] = "text"
    scores: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("text", "jsonl"):
            raise OptionError(f"--format must be text or jsonl, got {self.kind!r}")


TEXT = OutputFormat()


def read_chunks(
    stream: BinaryIO, max_lines: int = CHUNK_LINES, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[list[str]]:
    """Lines as they become available: each chunk holds the complete lines that one read
    returned (at most `max_lines`), so an interactive user gets each line translated at
    once and a pipe gets large batches. Invalid UTF-8 is replaced; a leading byte-order
    mark is dropped; a gzip-compressed input is refused in one line (it would be read as
    text, and translated as garbage); a line keeps at most its first `max_line_bytes`
    bytes, cut while reading, so a huge line without newlines never sits whole in
    memory."""
    fd = _fileno(stream)
    pending = bytearray()  # the start of a line whose end has not been read yet
    at_start, warned = True, False

    def bounded(line: bytes) -> bytes:
        nonlocal warned
        if len(line) > max_line_bytes and not warned:
            log.warning(
                "an input line is longer than %d bytes; only its start is translated",
                max_line_bytes,
            )
            warned = True
        return line[:max_line_bytes]

    while True:
        data = os.read(fd, 1 << 20) if fd is not None else stream.read(1 << 20)
        if not data:
            break
        if at_start:
            if data.startswith(GZIP_MAGIC):  # never the start of UTF-8 text
                raise OptionError(
                    "the input is gzip-compressed: decompress it first "
                    "(zcat FILE.gz | mtkit translate ...)"
                )
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
    """One input line: the source text, an optional target prefix, its constraints
    (each a tuple of alternative phrases, `mtkit.core.terms`) and, in jsonl, an optional
    `id` echoed back, or why the line could not be read."""

    src: str
    prefix: str = ""
    id: object = None
    error: str = ""
    constraints: tuple[tuple[str, ...], ...] = ()
    tgt_lang: str | None = None  # jsonl: the language to translate into (multilingual)
    tag: str = ""  # what the model reads before `src`: its target's tag, if multilingual
    target_tag: str = ""  # or, with `model.lang_tag: target`, what its output starts with

    @property
    def text(self) -> str:
        """What the model translates: the tag, then the source."""
        return self.tag + self.src


def read_constraints_field(value: object) -> tuple[tuple[str, ...], ...]:
    """A jsonl record's (or a request's) `constraints`: a list whose items are a phrase
    (text) or a list of alternative phrases; a ValueError says what is wrong."""
    if not isinstance(value, list):
        raise ValueError(f"expected a list of phrases, got {_shown(value)}")
    out = []
    for i, item in enumerate(value):
        alternatives = [item] if isinstance(item, str) else item
        if (
            not isinstance(alternatives, list)
            or not alternatives
            or not all(isinstance(p, str) and p.strip() for p in alternatives)
        ):
            raise ValueError(
                f"item {i}: a phrase (non-empty text) or a list of "
                f"alternative phrases, got {_shown(item)}"
            )
        for phrase in alternatives:
            bad = lone_surrogate(phrase)
            if bad:
                raise ValueError(f"item {i}: {bad}")
        out.append(tuple(dict.fromkeys(p.strip() for p in alternatives)))
    return tuple(dict.fromkeys(out))  # a constraint given twice is one


def parse_line(line: str, jsonl: bool) -> Request:
    """A text line is the source; a jsonl line is {"src": ..., "prefix"?: ...,
    "constraints"?: [...], "id"?: ...} (`read_constraints_field`). A malformed jsonl
    line becomes a `Request` with an error: not JSON, nested too deeply to parse, a
    number too long to read, text with a lone surrogate (an escape such as \\ud800
    that is no character), a bad `constraints` list, or an `id` that is not text, a
    number or null (`check_id`)."""
    if not jsonl:
        return Request(line)
    try:
        record = read_json(line) if line.strip() else {"src": ""}
    except ValueError as e:
        return Request("", error=f"not a JSON object: {e}")
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("src"), str)
        or not isinstance(record.get("prefix", ""), str)
        or not isinstance(record.get("tgt_lang", ""), str)
    ):
        got = record if not isinstance(record, dict) else sorted(record)
        return Request(
            "",
            id=_echoed_id(record),
            error=f'expected {{"src": text, "prefix"?: text, "constraints"?: '
            f'[...], "id"?: ...}}, got {_shown(got)}',
        )
    id_error = check_id(record.get("id"))
    if id_error:
        return Request("", error=id_error)
    for name in ("src", "prefix"):
        bad = lone_surrogate(record.get(name, ""))
        if bad:
            return Request("", id=record.get("id"), error=f"{name}: {bad}")
    try:
        constraints = read_constraints_field(record.get("constraints", []))
    except ValueError as e:
        return Request("", id=record.get("id"), error=f"constraints: {e}")
    return Request(
        record["src"],
        record.get("prefix", ""),
        record.get("id"),
        constraints=constraints,
        tgt_lang=record.get("tgt_lang"),
    )


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
        return (
            f"a lone surrogate \\u{ord(text[e.start]):04x} at character {e.start} "
            f"is not a character"
        )
    return ""


def _shown(value: object) -> str:
    """At most 80 characters of `value`, printable whatever it holds (a lone surrogate
    is escaped; a value nested too deeply is not shown)."""
    try:
        text = str(value)[:80]
    except RecursionError:
        return "(nested too deeply to show)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def format_lines(
    index: int,
    request: Request,
    hyps: list[Hypothesis],
    tgt_vocab: Vocab,
    opts: SearchOptions,
    output: OutputFormat = TEXT,
) -> list[str]:
    """The output lines of one input line (n of them with --nbest n in text format)."""
    if request.error:  # jsonl only: the line stays, as an error record
        return [
            json.dumps(
                {
                    "line": index,
                    **({"id": request.id} if request.id is not None else {}),
                    "error": request.error,
                },
                ensure_ascii=False,
            )
        ]
    texts = [tgt_vocab.decode(h.tokens) for h in hyps]
    links = [pharaoh(h.alignment or ()) for h in hyps]
    if output.kind == "jsonl":

        def entry(k: int) -> dict:
            return {
                "translation": texts[k],
                "score": round(hyps[k].score, 4),
                **({"alignment": links[k]} if opts.alignments else {}),
                **({"constraints_met": hyps[k].met} if hyps[k].met is not None else {}),
            }

        record = {
            "line": index,
            **({"id": request.id} if request.id is not None else {}),
            "source": request.src,
            **entry(0),
        }
        if opts.nbest > 1:
            record["nbest"] = [entry(k) for k in range(len(hyps))]
        return [json.dumps(record, ensure_ascii=False)]
    if opts.nbest > 1:
        return [
            f"{index} ||| {t} ||| {h.score:.4f}" + (f" ||| {a}" if opts.alignments else "")
            for t, h, a in zip(texts, hyps, links, strict=True)
        ]
    fields = (
        [texts[0]]
        + ([f"{hyps[0].score:.4f}"] if output.scores else [])
        + ([links[0]] if opts.alignments else [])
    )
    return ["\t".join(fields)]


def read_all_lines(source: BinaryIO, expected: int, what: str) -> BinaryIO:
    """All of `source` in memory, after checking that it has `expected` lines (as
    `read_chunks` counts them); `what` names the file it must match in the error."""
    data = source.read()
    lines = line_count(io.BytesIO(data))
    if lines != expected:
        raise OptionError(f"{what} has {plural(expected, 'line')}, the input has {lines}")
    return io.BytesIO(data)


def translate_stream(
    translator: Translator,
    source: BinaryIO,
    sink: TextIO,
    opts: SearchOptions,
    done: Callable[[int], None] | None = None,
    prefixes: list[str] | None = None,
    *,
    output: OutputFormat = TEXT,
    batch_tokens: int = BATCH_TOKENS,
    constraints: list[list[tuple[str, ...]]] | None = None,
    glossary: Glossary | None = None,
    tgt_lang: str | None = None,
) -> int:
    """Translate every line of `source` to `sink`; returns the number of input lines.
    In jsonl format the input lines are JSON records too (`parse_line`). `prefixes`
    and `constraints`: a target prefix and constraints for each input line (text
    format); a `glossary` adds the constraints its source terms require. `tgt_lang`:
    the language a multilingual model translates into (a jsonl record's own first).
    `done(n)` is called as lines are finished (for a progress bar)."""
    count = 0
    for lines in read_chunks(source):
        requests = [
            _into(
                parse_line(x, output.kind == "jsonl"), translator, tgt_lang, output.kind == "jsonl"
            )
            for x in lines
        ]
        chunk_prefixes = [r.prefix for r in requests]
        if prefixes is not None:
            chunk_prefixes = prefixes[count : count + len(lines)]
        given = constraints[count : count + len(lines)] if constraints is not None else None
        requests, wanted = searchable(
            translator, requests, given, glossary, opts, count, output.kind == "jsonl"
        )
        chunk_prefixes = [r.target_tag + p for r, p in zip(requests, chunk_prefixes, strict=True)]
        results = translator.translate(
            [r.text for r in requests],
            opts,
            done,
            chunk_prefixes if any(chunk_prefixes) else None,
            batch_tokens=batch_tokens,
            constraints=wanted,
        )
        out = []
        for offset, (request, hyps) in enumerate(zip(requests, results, strict=True)):
            if hyps and hyps[0].met is False:
                log.warning(
                    "%s: %s",
                    line_name(count + offset, output.kind == "jsonl"),
                    "the source is empty, and so is its translation: its constraints are not met"
                    if not request.text.strip()
                    else "no translation met all its constraints within the length "
                    "limit; it gets the best unconstrained one",
                )
            if request.tag or request.target_tag:
                hyps = untagged(hyps, bool(request.tag), _tag_ids(translator, request))
            out.extend(
                format_lines(count + offset, request, hyps, translator.tgt_vocab, opts, output)
            )
        sink.write("".join(x + "\n" for x in out))
        sink.flush()
        count += len(lines)
    return count


def _tag_ids(translator: Translator, request: Request) -> frozenset[int]:
    """The tag ids an output starting with a forced tag is cut after (none without)."""
    return (
        tag_ids(translator.tgt_vocab, translator.config.data) if request.target_tag else frozenset()
    )


def _into(request: Request, translator: Translator, tgt_lang: str | None, jsonl: bool) -> Request:
    """The request with its target language's tag (`languages.tagging`: a multilingual
    model's, before the source or as the output's start; nothing for a bilingual one). A
    language the model lacks, or none for a multilingual model, is the record's error in
    jsonl and one line in text."""
    if request.error or not request.src.strip():
        return request
    option = "--tgt-lang" if not jsonl or tgt_lang else '--tgt-lang or "tgt_lang"'
    try:
        placed = tagging(
            translator.config,
            request.tgt_lang or tgt_lang,
            "tgt_lang" if jsonl and request.tgt_lang else option,
        )
    except OptionError as e:
        if not jsonl:
            raise
        return replace(request, src="", error=str(e))
    return replace(request, tag=placed.source, target_tag=placed.target) if any(placed) else request


def line_constraints(
    requests: list[Request],
    given: list[list[tuple[str, ...]]] | None,
    glossary: Glossary | None = None,
) -> list[list[tuple[str, ...]]] | None:
    """Each request's constraints: its own (jsonl), the `given` ones (a constraints
    file), and those its source terms require in the `glossary`; None if none has any
    (a request with an error has none of its own)."""
    wanted = [[] if r.error else list(r.constraints) for r in requests]
    if given is not None:
        wanted = combine(wanted, given)
    if glossary is not None:
        wanted = combine(wanted, [glossary.constraints(r.src) for r in requests])
    return wanted if any(wanted) else None


def line_name(index: int, jsonl: bool = False) -> str:
    """How a message names input line `index` (from 0): "line 3"; in jsonl also as its
    record does, whose `line` counts from 0: 'line 3 (record "line": 2)'."""
    return f'line {index + 1} (record "line": {index})' if jsonl else f"line {index + 1}"


def searchable(
    translator: Translator,
    requests: list[Request],
    given: list[list[tuple[str, ...]]] | None,
    glossary: Glossary | None,
    opts: SearchOptions,
    count: int = 0,
    jsonl: bool = False,
) -> tuple[list[Request], list[list[tuple[str, ...]]] | None]:
    """The requests and each one's constraints, with those that cannot be searched for
    dealt with: by these options on this engine (`decoding.constraints_need`: a beam of
    two or more, a checkpoint), or on this line (`Translator.constraint_errors`). A
    line's own constraints (a file's, its jsonl record's) are its error record in jsonl,
    and one line in text (`count` lines came before this chunk; a file's were checked
    before anything was written); a glossary's are dropped from that line with a
    warning, so a stream never stops on a term."""
    own = line_constraints(requests, given)
    wanted = line_constraints(requests, given, glossary)
    if wanted is None:
        return requests, None
    need = constraints_need(opts, translator.capabilities)
    if need:  # no line's constraints can be searched for
        errors = [f"searching for them needs {need}" if w else "" for w in wanted]
    else:
        errors = translator.constraint_errors([r.text for r in requests], wanted, opts)
    if own is not None and any(errors):
        bad = [i for i, why in enumerate(errors) if why and own[i]]
        mine = (
            [errors[i] for i in bad]
            if need
            else translator.constraint_errors(
                [requests[i].text for i in bad], [own[i] for i in bad], opts
            )
        )
        for i, why in zip(bad, mine, strict=True):
            if why and not jsonl:
                raise OptionError(f"{line_name(count + i)}: {why}", "constraints")
            if why:
                requests[i] = replace(requests[i], src="", error=f"constraints: {why}")
                wanted[i] = []
    for i, why in enumerate(errors):
        if why and wanted[i] and not requests[i].error:
            log.warning(
                "%s: the glossary's terms are left out: %s", line_name(count + i, jsonl), why
            )
            wanted[i] = own[i] if own is not None else []
    return requests, wanted if any(wanted) else None


def check_constraint_lines(
    translator: Translator,
    source: BinaryIO,
    constraints: list[list[tuple[str, ...]]],
    opts: SearchOptions,
) -> None:
    """One line for the first input line (of `source`, which is read and rewound) whose
    constraints (one list per line) cannot be searched for
    (`Translator.constraint_errors`): checked before anything is written. (A glossary's
    terms never stop a translation: `searchable`.)"""
    lines = [line for chunk in read_chunks(source) for line in chunk]
    source.seek(0)
    wanted = line_constraints([Request(x) for x in lines], constraints) or []
    for i, why in enumerate(translator.constraint_errors(lines, wanted, opts) if wanted else []):
        if why:
            raise OptionError(f"line {i + 1}: {why}", "constraints")


def translate_texts(
    translator: Translator,
    lines: list[str],
    opts: SearchOptions,
    batch_tokens: int = BATCH_TOKENS,
    constraints: list[list[tuple[str, ...]]] | None = None,
    target_tags: list[str] | None = None,
) -> list[str]:
    """Best translation of each line, in order (for evaluation), with each line's
    `constraints` when given, and each output's forced start with `target_tags` (a
    multilingual model's with `model.lang_tag: target`), taken off again."""
    hyps = translator.translate(
        lines,
        opts,
        None,
        target_tags if target_tags else None,
        batch_tokens=batch_tokens,
        constraints=constraints,
    )
    if target_tags:
        ids = tag_ids(translator.tgt_vocab, translator.config.data)
        hyps = [untagged(h, False, ids) for h in hyps]
    return [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]

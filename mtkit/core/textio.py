"""Text in, text out, as frames: lines as they arrive, jsonl requests, output formats.

`read_chunks` reads whatever lines are available (so translation works interactively and
in a pipe; the session that translates them is `mtkit.engines.session`); invalid UTF-8 is
replaced, not fatal; a byte-order mark at the start is dropped; memory per line stays
bounded: bytes beyond `MAX_LINE_BYTES` are dropped while reading. In jsonl, each input
line is a request record (`parse_line`) and each output line a result record
(`format_lines`); a malformed record gets an error record, and the rest go on.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import math
import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mtkit.core.errors import OptionError, nearest, plural
from mtkit.core.hypothesis import pharaoh
from mtkit.core.search_options import SearchOptions
from mtkit.core.translation import Translation

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip file
CHUNK_LINES = 2000  # most lines translated (and sorted by length) together
READ_BYTES = 1 << 20  # what `read_chunks` reads at a time (its first read is checked)
# Longest input line kept, in bytes. A subword is at least one byte, so this is far more
# than any model's positions (1,024 by default); it only bounds memory on a runaway line.
MAX_LINE_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"
# A document in UTF-32 or UTF-16 starts with its byte-order mark: each names the encoding
# and the byte order the document is read and written in (UTF-32 LE's first, as it starts
# as UTF-16 LE's does).
WIDE_BOMS = {
    codecs.BOM_UTF32_LE: "utf-32-le",
    codecs.BOM_UTF32_BE: "utf-32-be",
    codecs.BOM_UTF16_LE: "utf-16-le",
    codecs.BOM_UTF16_BE: "utf-16-be",
}
# What binary input starts with, as the one line that refuses it names it (gzip has its
# own line, which says how to decompress it).
BINARY = (
    (b"PK\x03\x04", "a zip archive (a .docx, .xlsx, .pptx, .odt, .epub...?)"),
    (b"PK\x05\x06", "a zip archive (an empty one)"),
    (b"%PDF-", "a PDF"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Office file (a .doc, .xls, .ppt...?)"),
)
# What a refusal says mtkit translates, pointing at the one list of document formats
# (`mtkit.documents.formats`, above this layer) rather than naming them
TRANSLATED = "mtkit translates text and the document formats --format lists"


def line_count(stream: BinaryIO) -> int:
    """Lines in a binary stream, read to its end in blocks, without decoding: a last line
    without its newline counts. The one line counter (corpora in `mtkit.data.sources`,
    translate's input here and its bar in `mtkit.core.progress`)."""
    lines, last = 0, b"\n"
    while block := stream.read(1 << 20):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


LINES = ("text", "jsonl")  # the formats read line by line (every other is a document's)


@dataclass(frozen=True)
class OutputFormat:
    """How input is read and results are written: `text` (a line in, a line out: the
    translation, then with `scores` a tab and the confidence, with alignments a tab and
    the links; n-best as 'i ||| text ||| score'), `jsonl` (one record per input line),
    or a document format's name (the whole input is one document, translated by
    `mtkit.documents`; the names, and the check of one, are
    `mtkit.documents.formats`'); with `segments`, a markup format's input is read a
    line at a time, each line one document (a segment: an html or xml fragment), and
    written a line for each."""

    kind: str = "text"
    scores: bool = False
    segments: bool = False

    @property
    def document(self) -> bool:
        return self.kind not in LINES


TEXT = OutputFormat()


def read_chunks(
    stream: BinaryIO,
    max_lines: int = CHUNK_LINES,
    max_line_bytes: int = MAX_LINE_BYTES,
    *,
    continued: bool = False,
) -> Iterator[list[str]]:
    """Lines as they become available: each chunk holds the complete lines that one read
    returned (at most `max_lines`), so an interactive user gets each line translated at
    once and a pipe gets large batches. Invalid UTF-8 is replaced; a leading byte-order
    mark is dropped; a gzip-compressed input is refused in one line (it would be read as
    text, and translated as garbage); a line keeps at most its first `max_line_bytes`
    bytes, cut while reading, so a huge line without newlines never sits whole in
    memory. Binary input (an archive, a PDF, an image, NUL bytes) is refused in one line
    by its first chunk (`refuse_binary`). `continued`: the stream goes on from an input
    whose start was read and checked elsewhere (a rank's share of a file,
    `mtkit.engines.ranks`): its first bytes are neither checked nor stripped of a mark."""
    fd = _fileno(stream)
    pending = bytearray()  # the start of a line whose end has not been read yet
    at_start, warned = not continued, False

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
        data = os.read(fd, READ_BYTES) if fd is not None else stream.read(READ_BYTES)
        if not data:
            break
        if at_start:
            data, at_start = check_text_start(data), False
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


def check_text_start(data: bytes) -> bytes:
    """The first read of a line input (`read_chunks`), refused in one line where it is
    not UTF-8 text (binary, gzip, UTF-16 or UTF-32, NUL bytes), without its byte-order
    mark."""
    refuse_binary(data, "(zcat FILE.gz | mtkit translate ...)")
    wide = next((n for m, n in WIDE_BOMS.items() if data.startswith(m)), "")
    if wide:  # (its NUL bytes would say "binary")
        raise OptionError(
            f"the input is {wide[:6].upper()} text (it starts with its byte-order "
            f"mark), and lines are read as UTF-8: convert it first "
            f"(iconv -f {wide[:6].upper()} -t UTF-8 FILE)"
        )
    if b"\x00" in data:
        raise OptionError(_holds_nul(f"byte {data.index(0)}", "UTF-8"))
    return data.removeprefix(BOM)


DECLARED_WITHIN = 4096  # bytes of a document searched for its declaration


def refuse_binary(data: bytes, decompress: str = "") -> None:
    """One line (an `OptionError`) where `data`, the start of an input, is not text but
    a gzip file (`decompress` says how to unpack it), a zip archive (an office document,
    an e-book), a PDF or an image: read as text, its bytes were translated into garbage."""
    if data.startswith(GZIP_MAGIC):  # never the start of UTF-8 text
        raise OptionError(f"the input is gzip-compressed: decompress it first {decompress}".strip())
    for magic, what in BINARY:
        if data.startswith(magic):
            raise OptionError(_not_text(what))


def _not_text(what: str) -> str:
    return f"the input looks like {what}, not text: {TRANSLATED}"


def _holds_nul(where: str, encoding: str) -> str:
    return (
        f"the input holds a NUL character (at {where}), which no {encoding} text does: "
        f"binary data? {TRANSLATED}"
    )


def document_encoding(data: bytes, declared: re.Pattern[bytes] | None) -> str:
    """The encoding a document in `data` is read and written in: the one it declares
    where its format's `declared` (`mtkit.documents.formats`) finds it in its first
    `DECLARED_WITHIN` bytes (a template's "CHARSET" is none), else UTF-8; where it
    starts with a byte-order mark, the encoding that mark names (UTF-8's as
    "utf-8-sig"; UTF-16's and UTF-32's with their byte order), so that the translation
    starts with one too. A declaration is read from ASCII bytes, so one of UTF-16 or
    UTF-32 (without a mark) is read as UTF-8, as the HTML standard reads it. A declared
    encoding Python does not know, or a codec that is not a text encoding (hex, base64,
    rot13, zlib), is one line; so is binary input (`refuse_binary`)."""
    refuse_binary(data)
    if data.startswith(BOM):
        return "utf-8-sig"
    for mark, name in WIDE_BOMS.items():
        if data.startswith(mark):
            return name
    found = declared.search(data[:DECLARED_WITHIN]) if declared else None
    name = next((g for g in found.groups() if g), b"").decode("ascii") if found else ""
    if not name or name.upper() == "CHARSET":
        return "utf-8"
    try:
        codec = codecs.lookup(name)
    except LookupError:
        raise OptionError(f"the document declares an unknown encoding: {name}") from None
    if not codec._is_text_encoding:
        raise OptionError(f"the document declares an encoding that is not a text encoding: {name}")
    if codec.name.startswith(("utf-16", "utf-32")):  # its bytes are ASCII's: no UTF-16
        return "utf-8"
    return codec.name


def read_document(data: bytes, encoding: str = "utf-8") -> str:
    """A whole document's text, in `encoding` (`document_encoding`): a byte-order mark
    dropped, invalid bytes replaced (with a warning); binary input (`refuse_binary`, or
    a NUL character, which no text holds) refused in one line."""
    refuse_binary(data)
    text = data.decode(encoding, errors="replace").removeprefix("\ufeff")
    if "\x00" in text:
        raise OptionError(_holds_nul(f"character {text.index(chr(0))}", encoding))
    if "\ufffd" in text and "\ufffd" not in data.decode(encoding, errors="ignore"):
        log.warning("the input is not valid %s: its invalid bytes are replaced", encoding)
    return text


def write_document(text: str, encoding: str, references: bool) -> bytes:
    """A translated document's bytes, in the encoding its source was read in
    (`document_encoding`); in UTF-16 or UTF-32, after the byte-order mark it was read
    with. A character that encoding cannot hold is a character reference where the
    format has them (`references`: markup), else one line."""
    if encoding in WIDE_BOMS.values():
        text = "\ufeff" + text
    try:
        return text.encode(encoding, errors="xmlcharrefreplace" if references else "strict")
    except UnicodeEncodeError as e:
        raise OptionError(
            f"the translation holds {text[e.start]!r}, which the document's encoding "
            f"({encoding}) cannot hold: convert the document to UTF-8 first"
        ) from None


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


# A jsonl request record's fields (`parse_line`); any other is refused, as /v1 refuses a
# field its body does not have
JSONL_FIELDS = ("src", "prefix", "constraints", "tgt_lang", "id")


def parse_line(line: str, jsonl: bool) -> Request:
    """A text line is the source; a jsonl line is {"src": ..., "prefix"?: ...,
    "constraints"?: [...], "tgt_lang"?: ..., "id"?: ...} (`read_constraints_field`). A
    malformed jsonl line becomes a `Request` with an error: not JSON, nested too deeply
    to parse, a number too long to read, a field it does not have (`unknown_field`: a
    misspelt "prefx" was read as no prefix), text with a lone surrogate (an escape such
    as \\ud800 that is no character), a bad `constraints` list, or an `id` that is not
    text, a number or null (`check_id`)."""
    if not jsonl:
        return Request(line)
    try:
        record = read_json(line) if line.strip() else {"src": ""}
    except ValueError as e:
        return Request("", error=f"not a JSON object: {e}")
    unknown = unknown_field(record) if isinstance(record, dict) else ""
    if unknown:
        return Request("", id=_echoed_id(record), error=unknown)
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


def unknown_field(record: dict) -> str:
    """Why a jsonl record cannot be read for a field it holds that is none of
    `JSONL_FIELDS` (the first such, and the field it most likely meant, `nearest`), or
    "" where it holds none."""
    fields = ", ".join(JSONL_FIELDS)
    for name in record:
        if name in JSONL_FIELDS:
            continue
        bad = lone_surrogate(name)
        if bad:
            return f"a field's name holds {bad}; the fields are {fields}"
        close = nearest(name, JSONL_FIELDS)
        meant = f"did you mean {close}? " if close else ""
        return f"{_shown(name)}: no such field; {meant}the fields are {fields}"
    return ""


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


def blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace and invisible characters (zero-width
    and format characters such as U+200B and the byte-order mark, controls). Such a
    text is empty on every surface, and so is its translation: a model given only
    invisible pieces makes a sentence up."""
    return all(c.isspace() or unicodedata.category(c) in ("Cf", "Cc") for c in text)


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
    translations: list[Translation],
    opts: SearchOptions,
    output: OutputFormat = TEXT,
) -> list[str]:
    """The output lines of one input line (n of them with --nbest n in text format).
    Text: the translation, then with `scores` a tab and its confidence, with alignments a
    tab and the links; n-best as 'i ||| text ||| score'. jsonl: one record, with each
    sentence's source, translation and scores where the line was split."""
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
    links = [pharaoh(t.alignment or ()) for t in translations]
    if output.kind == "jsonl":

        def entry(k: int) -> dict:
            t = translations[k]
            return {
                "translation": t.text,
                "score": round(t.score, 4),
                "confidence": round(t.confidence, 4),
                **({"alignment": links[k]} if opts.alignments else {}),
                **({"constraints_met": t.constraints_met} if t.constraints_met is not None else {}),
                **(
                    {
                        "sentences": [
                            {
                                "source": s.source,
                                "translation": s.text,
                                "score": round(s.score, 4),
                                "confidence": round(s.confidence, 4),
                            }
                            for s in t.sentences
                        ]
                    }
                    if t.sentences
                    else {}
                ),
            }

        record = {
            "line": index,
            **({"id": request.id} if request.id is not None else {}),
            "source": request.src,
            **entry(0),
        }
        if opts.nbest > 1:
            record["nbest"] = [entry(k) for k in range(len(translations))]
        return [json.dumps(record, ensure_ascii=False)]
    if opts.nbest > 1:
        return [
            f"{index} ||| {t.text} ||| {t.score:.4f}" + (f" ||| {a}" if opts.alignments else "")
            for t, a in zip(translations, links, strict=True)
        ]
    fields = (
        [translations[0].text]
        + ([f"{translations[0].confidence:.4f}"] if output.scores else [])
        + ([links[0]] if opts.alignments else [])
    )
    return ["\t".join(fields)]


def read_lines(path: Path) -> list[str]:
    """A text file's lines (invalid UTF-8 replaced, a byte-order mark dropped); a last
    line without newline counts. Read once, so a pipe works too (`--ref <(...)`)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a text file")
    text = path.read_bytes().decode("utf-8", errors="replace").removeprefix("\ufeff")
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def read_all_lines(source: BinaryIO, expected: int, what: str) -> BinaryIO:
    """All of `source` in memory, after checking that it has `expected` lines (as
    `read_chunks` counts them); `what` names the file it must match in the error."""
    data = source.read()
    check_line_count(line_count(io.BytesIO(data)), expected, what)
    return io.BytesIO(data)


def check_line_count(lines: int, expected: int, what: str) -> None:
    """One line where the input's `lines` are not the `expected` lines of `what` (a file
    with a line for each input line: --prefix-file, --constraints)."""
    if lines != expected:
        raise OptionError(f"{what} has {plural(expected, 'line')}, the input has {lines}")


def line_name(index: int, jsonl: bool = False) -> str:
    """How a message names input line `index` (from 0): "line 3"; in jsonl also as its
    record does, whose `line` counts from 0: 'line 3 (record "line": 2)'."""
    return f'line {index + 1} (record "line": {index})' if jsonl else f"line {index + 1}"

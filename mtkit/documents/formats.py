"""The one table of document formats (`FORMATS`): a record per format, knowing its own
facts (its name, its files' suffixes, the package that reads it and the extra that
installs it, where a document declares its encoding, how it is translated), and the
one dispatch (`translate_documents`: documents of a format in, their translations
out) that the API, the CLI and the server take. Nothing else names the formats: each
reads them here (the names `--format` and `format=` take, a file's format by its suffix,
the help and the errors that list them).

This table lives here, above `mtkit.core`, because a record holds how its documents are
translated (this package's code); what `mtkit.core.textio` does with a document's bytes
(its encoding, written back) is given the record's facts as arguments."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePath
from typing import Any

from mtkit.core.errors import OptionError, UserError
from mtkit.core.textio import LINES, OutputFormat, document_encoding, write_document
from mtkit.core.translation import Translation, weighted
from mtkit.documents import catalogs, markup, office, subtitles, xliff
from mtkit.documents.elements import PLAIN, MarkupRules
from mtkit.documents.rounds import Rounds, Translate, translate_rounds

# An XML declaration's encoding (an XML document's, and an XHTML page's read as html)
XML_DECLARED = rb"\A\s*<\?xml[^>]*?\bencoding\s*=\s*[\"']([\w.:-]+)"


class MissingExtra(UserError, ImportError):
    """A format whose package is not installed (one line: what to install)."""


@dataclass(frozen=True)
class DocumentFormat:
    """One document format: its `name` (`--format`, `format=`), the `suffixes` of its
    files (lower case), how a document of it is translated (`rounds`: a document's text
    in, `mtkit.documents.rounds.Rounds` out), the `package` that reads it and the
    `extra` that installs it (None: mtkit's own reader), where its first bytes declare
    their encoding (`declared`, None: nowhere), whether a character its encoding
    cannot hold is written as a character reference (`references`: markup), whether
    it is a bilingual file whose `rounds` are given the language translated into and
    whether targets a translator filled are translated again (`bilingual`: as `target=`,
    the language code or None, and `retranslate=`; XLIFF), whether they take the caller's
    `mtkit.documents.elements.MarkupRules` (`markup`: which elements are inline, blocks
    or kept, as DeepL's tag options and ITS rules say), and whether a document of it is
    a file's bytes, not text (`binary`: a zip of XML parts, an office document or an
    e-book; its `rounds` take the bytes and return the translated file's:
    `translate_files`)."""

    name: str
    suffixes: tuple[str, ...]
    rounds: Callable[[Any], Rounds[Any]]
    package: str | None = None
    extra: str | None = None
    declared: re.Pattern[bytes] | None = None
    references: bool = False
    bilingual: bool = False
    markup: bool = False
    binary: bool = False

    def check_installed(self) -> None:
        """One line (`MissingExtra`) where the package that reads the format is missing."""
        if self.package is None:
            return
        try:
            __import__(self.package)
        except ImportError:
            raise MissingExtra(
                f"--format {self.name} needs the {self.package} package: "
                f"pip install 'mtkit[{self.extra}]'"
            ) from None

    def encoding(self, data: bytes) -> str:
        """The encoding a document of this format in `data` is read and written in."""
        return document_encoding(data, self.declared)

    def written(self, text: str, encoding: str) -> bytes:
        """A translated document's bytes, in the `encoding` its source was read in."""
        return write_document(text, encoding, self.references)


FORMATS = {
    f.name: f
    for f in (
        DocumentFormat(
            "html",
            (".html", ".htm"),
            partial(markup.rounds, format="html"),
            declared=re.compile(
                XML_DECLARED + rb"|<meta\b[^>]*?\bcharset\s*=\s*[\"']?([\w.:-]+)", re.I
            ),
            references=True,
            markup=True,
        ),
        DocumentFormat(
            "xml",
            (".xhtml", ".xml"),
            partial(markup.rounds, format="xml"),
            declared=re.compile(XML_DECLARED),
            references=True,
            markup=True,
        ),
        DocumentFormat("srt", (".srt",), subtitles.rounds, package="srt", extra="documents"),
        DocumentFormat(
            "po",
            (".po", ".pot"),
            catalogs.rounds,
            package="polib",
            extra="documents",
            declared=re.compile(rb"\"Content-Type:[^\"]*?charset=([\w.:-]+)", re.I),
        ),
        DocumentFormat(
            "xliff",
            (".xlf", ".xliff"),
            xliff.rounds,
            package="lxml",
            extra="documents",
            declared=re.compile(XML_DECLARED),
            references=True,
            bilingual=True,
        ),
        *(
            DocumentFormat(
                name,
                (f".{name}",),
                partial(office.rounds, format=name),
                package="lxml",
                extra="documents",
                binary=True,
            )
            for name in ("docx", "pptx", "xlsx", "odt", "odp", "epub")
        ),
    )
}


BILINGUAL = [f.name for f in FORMATS.values() if f.bilingual]  # files that hold a target

TEXT_SUFFIX = ".txt"  # a file of plain text: "text", each line a paragraph

# Files that no format reads, by their suffix, each with the one line that refuses it.
REFUSED = {
    ".pdf": "PDF is not translated: a PDF holds glyphs placed on pages, not paragraphs and "
    "runs, and no well-kept library writes one back with its layout; convert it to docx, "
    "odt or html first",
}


def format_of(path: str | os.PathLike[str]) -> str | None:
    """The format of a file by its name's suffix, in any case: a name in `FORMATS`, "text"
    for `TEXT_SUFFIX`, None for a suffix no format has; one line (`OptionError`) for a
    suffix `REFUSED` names (a PDF). The one lookup of the API's and the CLI's input file
    and the server's uploads."""
    suffix = PurePath(os.fspath(path)).suffix.lower()
    if suffix in REFUSED:
        raise OptionError(REFUSED[suffix], "format")
    if suffix == TEXT_SUFFIX:
        return "text"
    return next((f.name for f in FORMATS.values() if suffix in f.suffixes), None)


def suffixes(format: str | None = None) -> tuple[str, ...]:
    """The suffixes of `format`'s files (a name in `FORMATS`, or "text": `TEXT_SUFFIX`);
    None: every file's that `format_of` knows, plain text's first."""
    if format is None:
        return (TEXT_SUFFIX, *(s for f in FORMATS.values() for s in f.suffixes))
    return (TEXT_SUFFIX,) if format == "text" else FORMATS[format].suffixes


def listed(names: list[str] | tuple[str, ...], last: str = "or") -> str:
    """Names as a sentence lists them: "html, xml, srt or po"."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def output_format(
    name: str | None, input: Path | None = None, scores: bool = False, segments: bool = False
) -> OutputFormat:
    """`translate --format NAME` (None: the format of `input`'s suffix, `format_of`,
    else text) as an `OutputFormat`, with `segments` (--segments: each line one document)
    for a markup format; one line where NAME is no format (saying why for one `REFUSED`:
    pdf), or --segments no markup format's."""
    if name is None:
        name = (format_of(input) if input else None) or "text"
    if name not in (*LINES, *FORMATS):
        why = f": {REFUSED[f'.{name}']}" if f".{name}" in REFUSED else ""
        raise OptionError(f"--format must be {listed([*LINES, *FORMATS])}, got {name!r}{why}")
    if segments and not (name in FORMATS and FORMATS[name].markup):
        markup = listed([f"--format {f.name}" for f in FORMATS.values() if f.markup])
        raise OptionError(f"--segments reads each line as a segment of {markup}, not {name}")
    return OutputFormat(name, scores, segments)


def translate_documents(
    documents: list[str],
    format: str,
    translate: Translate,
    target: str | None = None,
    rules: MarkupRules = PLAIN,
    retranslate: bool = False,
) -> list[Translation]:
    """Each of `documents` (of `format`) translated with `translate` (texts in,
    `Translation`s with word alignments out, in order) into the language `target` (None:
    not known; a bilingual format, which names it, is told it, and `retranslate`: whether
    its targets a translator filled are translated again): the texts every document
    wants in a round go to one call (`translate_rounds`). Each result's `sentences` are
    the translations of its texts, its scores theirs, weighted by tokens
    (`translation.weighted`). `rules`: the caller's say on a markup format's elements
    (one line for another format's documents, which have none to say it of)."""
    known = FORMATS[format]
    if known.binary:
        raise OptionError(binary_refused(format), "format")
    known.check_installed()
    check_rules(format, rules)
    check_retranslate(format, retranslate)
    told = {"target": target, "retranslate": retranslate} if known.bilingual else {}
    if known.markup:
        told["rules"] = rules
    done = translate_rounds([known.rounds(d, **told) for d in documents], translate)
    return [
        Translation(document, text, *weighted(parts), sentences=tuple(parts))
        for document, (text, parts) in zip(documents, done, strict=True)
    ]


def check_retranslate(format: str, retranslate: bool, option: str = "retranslate") -> None:
    """One line (naming `option`) where targets are to be translated again in a format
    that holds none: only a bilingual file (XLIFF) has a translator's targets."""
    if retranslate and not (format in FORMATS and FORMATS[format].bilingual):
        raise OptionError(
            f"{option} is for bilingual files ({listed(BILINGUAL)}), not {format}", option
        )


def check_rules(format: str, rules: MarkupRules) -> None:
    """One line where the caller's markup `rules` are given for a `format` (text, jsonl,
    a document's) that has no elements to say them of."""
    if rules != PLAIN and not (format in FORMATS and FORMATS[format].markup):
        markup = listed([f.name for f in FORMATS.values() if f.markup])
        raise OptionError(f"{rules.option} is for {markup} documents, not {format}", rules.option)


def translate_document(
    document: str,
    format: str,
    translate: Translate,
    target: str | None = None,
    rules: MarkupRules = PLAIN,
    retranslate: bool = False,
) -> Translation:
    """One document translated (`translate_documents`)."""
    (translated,) = translate_documents([document], format, translate, target, rules, retranslate)
    return translated


def binary_refused(format: str) -> str:
    """The one line that says a file format's document is bytes, not text."""
    return (
        f"format {format} is a file, not text: translate its bytes "
        f"(Translator.translate_document, mtkit translate -i FILE.{format})"
    )


def translate_files(files: list[bytes], format: str, translate: Translate) -> list[bytes]:
    """Each of `files` (the bytes of a `binary` format's documents: docx, pptx, xlsx, odt,
    odp, epub) translated with `translate`, the texts every file wants in a round in one
    call (`translate_rounds`): each translated file's bytes."""
    known = FORMATS[format]
    if not known.binary:
        raise OptionError(f"format {format} is text, not a file's bytes", "format")
    known.check_installed()
    return [out for out, _ in translate_rounds([known.rounds(f) for f in files], translate)]

"""A document in one of the formats people send, translated: the one entry to
`mtkit.documents` for the API and the CLI."""

from __future__ import annotations

from mtkit.core.errors import UserError
from mtkit.core.translation import Translation
from mtkit.documents.messages import Translate

FORMATS = ("html", "xml", "srt", "po")
PACKAGES = {"srt": "srt", "po": "polib"}  # what reads each format, from mtkit[documents]


class MissingExtra(UserError, ImportError):
    """A format whose package is not installed (one line: what to install)."""


def translate_document(document: str, format: str, translate: Translate) -> Translation:
    """`document` translated with `translate` (texts in, `Translation`s with word
    alignments out, in order; called once with every text the document holds)."""
    from mtkit.documents.markup import summary, translate_markup

    if format in ("html", "xml"):
        return translate_markup(document, format, translate)
    if format in PACKAGES:
        try:
            __import__(PACKAGES[format])
        except ImportError:
            raise MissingExtra(
                f"--format {format} needs the {PACKAGES[format]} package: "
                "pip install 'mtkit[documents]'"
            ) from None
    done: list[Translation] = []

    def kept(texts: list[str]) -> list[Translation]:
        found = translate(texts)
        done.extend(found)
        return found

    if format == "srt":
        from mtkit.documents.subtitles import translate_srt

        return summary(document, translate_srt(document, kept), done)
    if format == "po":
        from mtkit.documents.catalogs import translate_po

        return summary(document, translate_po(document, kept), done)
    raise ValueError(f"unknown document format {format!r}")

"""Short texts from a file format (a subtitle cue, a gettext message): plain text or
text with inline tags, placeholders kept (`mtkit.documents.placeholders`), translated
together in one batch."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

from mtkit.core.translation import Translation
from mtkit.documents.markup import Prepared, finish, prepare

TAGGED = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>")  # a message with markup in it
Translate = Callable[[list[str]], list[Translation]]


@dataclass
class Message:
    """One message read for translation: markup (`tagged`) or plain text, escaped so
    the markup reader takes it as text."""

    prepared: Prepared
    tagged: bool

    @classmethod
    def read(cls, text: str) -> Message:
        tagged = bool(TAGGED.search(text))
        return cls(prepare(text if tagged else html.escape(text, quote=False), "html"), tagged)

    def written(self, translated: list[Translation]) -> str:
        out = finish(self.prepared, translated)
        return out if self.tagged else html.unescape(out)


def translate_messages(messages: list[str], translate: Translate) -> list[str]:
    """Each message translated, its tags and placeholders carried through; all in one
    call of `translate` (texts in, `Translation`s with word alignments out)."""
    read = [Message.read(m) for m in messages]
    texts = [t for m in read for t in m.prepared.texts]
    translated = translate(texts) if texts else []
    out, at = [], 0
    for m in read:
        n = len(m.prepared.texts)
        out.append(m.written(translated[at : at + n]))
        at += n
    return out

"""Short texts from a file format (a subtitle cue, a gettext message): text with some
inline tags, placeholders kept (`mtkit.documents.placeholders`), translated together in
one batch. Such a message is not HTML: only its tags are markup, and its text (`&`, `<`,
`&copy;` and all) comes back as it was written."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

from mtkit.core.translation import Translation
from mtkit.documents.markup import Prepared, finish, prepare
from mtkit.documents.rounds import Rounds, Translate, translate_rounds

TAGGED = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>")  # a tag in a message


def _outside_tags(text: str, change: Callable[[str], str]) -> str:
    """`text` with `change` applied to each stretch of it between its tags."""
    out, at = [], 0
    for tag in TAGGED.finditer(text):
        out += [change(text[at : tag.start()]), tag.group()]
        at = tag.end()
    return "".join(out) + change(text[at:])


@dataclass
class Message:
    """One message read for translation by the markup reader, its text escaped so that
    the reader takes it as text and only its tags as markup."""

    prepared: Prepared

    @classmethod
    def read(cls, text: str) -> Message:
        return cls(prepare(_outside_tags(text, lambda s: html.escape(s, quote=False)), "html"))

    def written(self, translated: list[Translation]) -> str:
        # The markup writer escapes every text it writes (words, placeholders, text kept
        # as it stood), so unescaping all text between tags gives the message's own back.
        return _outside_tags(finish(self.prepared, translated), html.unescape)


def rounds(messages: list[str]) -> Rounds[list[str]]:
    """Each message translated, its tags and placeholders carried through; all in one
    round."""
    read = [Message.read(m) for m in messages]
    translated = yield [t for m in read for t in m.prepared.texts]
    out, at = [], 0
    for m in read:
        n = len(m.prepared.texts)
        out.append(m.written(translated[at : at + n]))
        at += n
    return out


def translate_messages(messages: list[str], translate: Translate) -> list[str]:
    """Each message translated (`rounds`) with `translate` (texts in, `Translation`s
    with word alignments out), in one call."""
    ((out, _),) = translate_rounds([rounds(messages)], translate)
    return out

"""gettext catalogues (.po, through polib): each untranslated message gets a msgstr, a
plural message each of its plural forms (the singular's translation in form 0, the
plural's in the others, as many as the catalogue's Plural-Forms names). A message's
lines and tab-separated columns are translated one by one, its newlines and tabs kept;
placeholders (`%s`, `{name}`...) and inline tags are carried through
(`mtkit.documents.messages`). Only the new msgstr lines are written: the rest of the
file (header, contexts, comments, flags, references, translated messages) is kept byte
for byte."""

from __future__ import annotations

import re

from mtkit.core.errors import UserError
from mtkit.documents.messages import Translate, translate_messages

NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
MOST_FORMS = 8  # the most plural forms of any language gettext knows is 6
# A line of a .po file that is not a comment: a keyword and a string, or a string that
# continues the one above. polib reads some lines that are neither (an unterminated
# string) as if they were, and the message comes out cut.
LINE = re.compile(r'(?:(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+)?"(?:[^"\\]|\\.)*"')
SEPARATOR = re.compile(r"([\n\t]+)")  # between a message's lines or its columns


class CatalogError(UserError, ValueError):
    """A .po file that cannot be read (one line)."""


def translate_po(document: str, translate: Translate) -> str:
    """The .po `document` with its untranslated messages translated with `translate`."""
    import polib

    lines = document.splitlines(keepends=True)
    for n, line in enumerate(lines, 1):
        line = line.strip().lstrip("\ufeff")  # (a byte-order mark)
        if line and not line.startswith("#") and not LINE.fullmatch(line):
            raise CatalogError(
                f"not a gettext (.po) file: line {n} is not a keyword and a quoted string: "
                f"{line[:60]!r}"
            )
    try:
        # (a newline: polib would open a file whose name the text happened to be)
        catalog = polib.pofile(document if "\n" in document else document + "\n")
    except (OSError, ValueError) as e:  # polib says what it could not parse
        raise CatalogError(f"not a gettext (.po) file: {str(e).splitlines()[0][:120]}") from None
    match = NPLURALS.search(catalog.metadata.get("Plural-Forms", ""))
    forms = int(match.group(1)) if match else 2
    if not 1 <= forms <= MOST_FORMS:
        raise CatalogError(
            f"the catalogue's Plural-Forms says nplurals={forms}: a language has from 1 to "
            f"{MOST_FORMS} plural forms"
        )
    todo = [
        e
        for e in catalog
        if not e.obsolete and e.msgid and not (e.msgstr or any(e.msgstr_plural.values()))
    ]
    texts = [x for e in todo for x in ([e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid])]
    translated = iter(_translate_lines(texts, translate))
    for e in todo:
        if e.msgid_plural:
            one, many = next(translated), next(translated)
            e.msgstr_plural = {k: one if k == 0 else many for k in range(max(forms, 1))}
        else:
            e.msgstr = next(translated)
    text = "".join(_with_msgstrs(lines, list(catalog), {id(e) for e in todo}))
    return text if text.endswith("\n") else text + "\n"


def _translate_lines(messages: list[str], translate: Translate) -> list[str]:
    """`translate_messages`, each line of a message (and each column of a line, between
    tabs) a text of its own: a message's layout (a usage text's blank lines, a leading or
    trailing newline, a tab before a value) is kept exactly."""
    pieces = [SEPARATOR.split(m) for m in messages]  # text, separator, text, ...
    translated = iter(translate_messages([t for p in pieces for t in p[::2]], translate))
    return ["".join(x if k % 2 else next(translated) for k, x in enumerate(p)) for p in pieces]


def _with_msgstrs(lines: list[str], entries: list, changed: set[int]) -> list[str]:
    """The file's `lines` with the msgstr lines of each `changed` entry (by id) written
    anew by polib, from its first msgstr line to the end of the entry (a msgstr comes
    last in an entry), with the file's line ends; every other line as it was."""
    out = list(lines)
    # an entry's first line, comments included (polib numbers them from 1, but an entry
    # that starts the file, with no header before it, 0)
    starts = [max(e.linenum - 1, 0) for e in entries]
    ends = starts[1:] + [len(lines)]
    for e, start, stop in reversed(list(zip(entries, starts, ends, strict=True))):
        if id(e) not in changed:
            continue
        while stop > start and not lines[stop - 1].strip():
            stop -= 1  # the blank lines after an entry stay
        first = next(k for k in range(start, stop) if lines[k].lstrip().startswith("msgstr"))
        eol = "\r\n" if lines[first].endswith("\r\n") else "\n"
        written = str(e).splitlines()
        msgstr = next(k for k, x in enumerate(written) if x.startswith("msgstr"))
        out[first:stop] = [x + eol for x in written[msgstr:]]
    return out

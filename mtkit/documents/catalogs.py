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
from mtkit.documents import messages
from mtkit.documents.rounds import Rounds

NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
MOST_FORMS = 8  # the most plural forms of any language gettext knows is 6
# A line of a .po file that is not a comment: a keyword and a string, or a string that
# continues the one above. polib reads some lines that are neither (an unterminated
# string) as if they were, and the message comes out cut.
LINE = re.compile(r'(?:(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+)?"(?:[^"\\]|\\.)*"')
SEPARATOR = re.compile(r"([\n\t]+)")  # between a message's lines or its columns


class CatalogError(UserError, ValueError):
    """A .po file that cannot be read (one line)."""


def rounds(document: str) -> Rounds[str]:
    """The .po `document` with its untranslated messages translated
    (`mtkit.documents.rounds.Rounds`, one round)."""
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
    if not todo:  # (a header, comments or nothing at all: the file as it was)
        return document
    texts = [x for e in todo for x in ([e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid])]
    translated = iter((yield from _translate_lines(texts)))
    for e in todo:
        if e.msgid_plural:
            one, many = next(translated), next(translated)
            e.msgstr_plural = {k: one if k == 0 else many for k in range(max(forms, 1))}
        else:
            e.msgstr = next(translated)
    return "".join(_with_msgstrs(lines, todo))


def _translate_lines(texts: list[str]) -> Rounds[list[str]]:
    """`mtkit.documents.messages.rounds`, each line of a message (and each column of a
    line, between tabs) a text of its own: a message's layout (a usage text's blank
    lines, a leading or trailing newline, a tab before a value) is kept exactly."""
    pieces = [SEPARATOR.split(m) for m in texts]  # text, separator, text, ...
    translated = iter((yield from messages.rounds([t for p in pieces for t in p[::2]])))
    return ["".join(x if k % 2 else next(translated) for k, x in enumerate(p)) for p in pieces]


def _with_msgstrs(lines: list[str], entries: list) -> list[str]:
    """The file's `lines` with the msgstr lines of each of `entries` (a msgstr keyword
    line and the string lines that continue it; every plural form's) written anew by
    polib, indented as the first was and with its line end (the file's first line end
    where it has none, at the end of a file: that last line gets none); every other line
    (comments, blank lines, obsolete entries after it) as it was."""
    out = list(lines)
    eol = next((end for x in lines if (end := x[len(x.rstrip("\r\n")) :])), "\n")
    for e in reversed(entries):
        # polib numbers an entry's msgid line from 1 (0 for an entry that starts the
        # file); its msgstr lines come after it
        first = next(
            k for k in range(max(e.linenum - 1, 0), len(lines)) if _keyword(lines[k], "msgstr")
        )
        stop = first + 1
        while stop < len(lines) and (
            _keyword(lines[stop], "msgstr[") or lines[stop].lstrip().startswith('"')
        ):
            stop += 1
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        end = lines[stop - 1][len(lines[stop - 1].rstrip("\r\n")) :]
        written = str(e).splitlines()
        written = written[next(k for k, x in enumerate(written) if x.startswith("msgstr")) :]
        ends = [end or eol] * (len(written) - 1) + [end]
        out[first:stop] = [indent + x + y for x, y in zip(written, ends, strict=True)]
    return out


def _keyword(line: str, keyword: str) -> bool:
    """Whether `line` starts (after its indentation) with `keyword`."""
    return line.lstrip().startswith(keyword)

"""gettext catalogues (.po, through polib): each untranslated message gets a msgstr, a
plural message each of its plural forms (the singular's translation in form 0, the
plural's in the others, as many as the catalogue's Plural-Forms names). Placeholders
(`%s`, `{name}`...) and inline tags are carried through (`mtkit.documents.messages`);
contexts, comments, flags, references and translated messages are kept as they are."""

from __future__ import annotations

import re

from mtkit.core.errors import UserError
from mtkit.documents.messages import Translate, translate_messages

NPLURALS = re.compile(r"nplurals\s*=\s*(\d+)")
MOST_FORMS = 8  # the most plural forms of any language gettext knows is 6


class CatalogError(UserError, ValueError):
    """A .po file that cannot be read (one line)."""


def translate_po(document: str, translate: Translate) -> str:
    """The .po `document` with its untranslated messages translated with `translate`."""
    import polib

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
    translated = iter(translate_messages(texts, translate))
    for e in todo:
        if e.msgid_plural:
            one, many = next(translated), next(translated)
            e.msgstr_plural = {k: one if k == 0 else many for k in range(max(forms, 1))}
        else:
            e.msgstr = next(translated)
    text = str(catalog)
    if not catalog.header and text.startswith("#\n") and not document.startswith("#"):
        text = text[2:]  # polib writes an empty header comment as "#"
    return text if text.endswith("\n") else text + "\n"

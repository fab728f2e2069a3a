"""Placeholders: the parts of a message a program fills in (`%s`, `%(name)s`, `%1$d`,
`{name}`, `{0:>5}`, `{{ var }}`, `%{name}`, `${name}`, `$name`), which must come out of a
translation exactly as they went in. They are taken out of the text the model reads and
put back as atoms beside the target word their neighbour went to
(`mtkit.documents.markup.place`), so each one is in the output exactly once, checked by
construction, never left to the model. Numbers stay in the text (they shape the
sentence: "1 dog", "3 dogs") and are checked afterwards (`restore_numbers`)."""

from __future__ import annotations

import logging
import re
from collections import Counter

from mtkit.core.translation import Translation

log = logging.getLogger(__name__)

PLACEHOLDER = re.compile(
    r"%\([^()\s]+\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # %(name)s
    r"|%(?:\d+\$)?[-+#0]*(?:\d+|\*)?(?:\.\d+)?[hlLqjzt]*[diouxXeEfFgGcsa@]"  # %s %1$d %.2f
    r"|%%"
    r"|%\{\w+\}"  # %{name}
    r"|\{\{[^{}]*\}\}"  # {{ var }}
    r"|\{[\w.\[\]]*(?:![rsa])?(?::[^{}]*)?\}"  # {} {0} {name} {x:>5}
    r"|\$\{[^{}]*\}"  # ${name}
    r"|\{\\[^{}]*\}"  # {\an8}: a subtitle's override tag
    r"|\$[A-Za-z_]\w*"  # $name
)
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def placeholders(text: str) -> list[str]:
    """The placeholders of `text`, in order."""
    return PLACEHOLDER.findall(text)


def _digits(number: str) -> str:
    return re.sub(r"\D", "", number)


def restore_numbers(translation: Translation) -> Translation:
    """The translation with each number of its source that went missing put back: a
    target word aligned to the source word that held it, and holding a number the source
    lacks, gets the source's number instead ("3.5" and "3,5" count as the same number:
    a translation may write it as its language does). A number that cannot be put back
    this way is logged."""
    from dataclasses import replace

    src_words, tgt_words = translation.source.split(), translation.text.split()
    wanted = [_digits(n) for n in NUMBER.findall(translation.source)]
    have = {_digits(n) for n in NUMBER.findall(translation.text)}
    missing = [n for n in wanted if n not in have]
    if not missing:
        return translation
    known = set(wanted)
    left = Counter(missing)  # how many of each number are still to be put back
    partners: dict[int, list[int]] = {}
    for s, t in translation.alignment or ():
        if t < len(tgt_words):
            partners.setdefault(s, []).append(t)
    for s, word in enumerate(src_words):
        for number in NUMBER.findall(word):
            if not left[_digits(number)]:
                continue
            for t in sorted(partners.get(s, ())):
                found = NUMBER.search(tgt_words[t])
                if found and _digits(found.group()) not in known:
                    tgt_words[t] = (
                        tgt_words[t][: found.start()] + number + tgt_words[t][found.end() :]
                    )
                    left[_digits(number)] -= 1
                    break
    put_back = Counter(missing) - left  # (only what is above zero)
    changed = bool(put_back)
    if any(left.values()):
        still = []  # in the source's order: a number put back was the first of its kind
        for n in missing:
            if put_back[n]:
                put_back[n] -= 1
            else:
                still.append(n)
        log.warning(
            "a number of the source is not in its translation: %s (in %r)",
            ", ".join(still),
            translation.source[:80],
        )
    return replace(translation, text=" ".join(tgt_words)) if changed else translation

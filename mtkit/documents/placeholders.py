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


# Numbers one to twelve as words, in the languages of mtkit's corpora and their
# neighbours (and their common inflections): a model trained on image captions writes
# "2 dogs" as "Zwei Hunde", and a document wants its digits back (`restore_numbers`).
# One table for all of them: a word is only ever replaced where the alignment links it
# to a source number of the same value.
NUMBER_WORDS = {
    word: value
    for value, words in enumerate(
        (
            "one ein eine einen einem einer eines un une uno una um uma een jeden jedna jedno",
            "two zwei deux dos due dois duas twee dva dvě",
            "three drei trois tres tre três drie tři",
            "four vier quatre cuatro quattro quatro čtyři",
            "five fünf cinq cinco cinque vijf pět",
            "six sechs seis sei zes šest",
            "seven sieben sept siete sette sete zeven sedm",
            "eight acht huit ocho otto oito osm",
            "nine neun neuf nueve nove negen devět",
            "ten zehn dix diez dieci dez tien deset",
            "eleven elf onze once undici jedenáct",
            "twelve zwölf douze doce dodici doze twaalf dvanáct",
        ),
        start=1,
    )
    for word in words.split()
}
SPELLED = re.compile(r"^(\W*)(\w+)(\W*)$")


def _spelled(word: str, number: str) -> str | None:
    """`word` with `number` in place of the same number written as a word ("Zwei" for
    "2"), or None where it is not that."""
    found = SPELLED.match(word)
    if not number.isdigit() or found is None:
        return None
    if NUMBER_WORDS.get(found.group(2).lower()) != int(number):
        return None
    return found.group(1) + number + found.group(3)


def restore_numbers(translation: Translation) -> Translation:
    """The translation with each number of its source that went missing put back: a
    target word aligned to the source word that held it, and holding a number the source
    lacks, or that number written as a word (`NUMBER_WORDS`: "Zwei" for "2"), gets the
    source's number instead ("3.5" and "3,5" count as the same number: a translation may
    write it as its language does). A number that cannot be put back this way is
    logged."""
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
                spelled = None if found else _spelled(tgt_words[t], number)
                if found and _digits(found.group()) not in known:
                    tgt_words[t] = (
                        tgt_words[t][: found.start()] + number + tgt_words[t][found.end() :]
                    )
                elif spelled is not None:
                    tgt_words[t] = spelled
                else:
                    continue
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

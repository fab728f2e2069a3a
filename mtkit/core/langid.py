"""Which language a text is in: `py3langid` (its model ships inside the package, so
nothing is downloaded), behind the optional extra `pip install 'mtkit[langid]'`. For the
off-target rate of a multilingual model's translations (`mtkit eval --lang`) and for
`data.langid_filter` (no torch).

Codes are ISO 639-1 as py3langid gives them (en, de, fr, cs); a run's code with a region
or script (pt_BR, zh_Hant) is compared by its language part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mtkit.core.errors import UserError, plural


class LangIdError(UserError, RuntimeError):
    """The language identifier is not installed (one line)."""


@cache
def _identifier(among: tuple[str, ...] | None):
    """py3langid's identifier, choosing only `among` those languages when given (short
    captions are told apart far better among a run's four languages than among 97)."""
    try:
        from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise LangIdError(
            "language identification needs py3langid: pip install 'mtkit[langid]'"
        ) from None
    identifier = LanguageIdentifier.from_modelpath(Path(MODEL_DIR) / MODEL_FILE)
    if among:
        unknown = sorted(set(among) - set(identifier.nb_classes))
        if unknown:
            raise LangIdError(
                f"py3langid does not know {', '.join(unknown)}; it knows "
                f"{len(identifier.nb_classes)} ISO 639-1 codes such as en, de"
            )
        identifier.set_languages(list(among))
    return identifier


def codes(text: str | None) -> list[str]:
    """ "en, de,fr" -> ["en", "de", "fr"] (None or "": [])."""
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def base(lang: str) -> str:
    """A code's language part: pt_BR -> pt, zh-Hant -> zh."""
    return lang.replace("-", "_").split("_")[0].lower()


def detect(texts: Sequence[str], among: Sequence[str] | None = None) -> list[str]:
    """Each text's most likely language ("" for an empty one), among those languages
    when given (else all py3langid knows)."""
    identifier = _identifier(tuple(sorted({base(x) for x in among})) if among else None)
    return [identifier.classify(t)[0] if t.strip() else "" for t in texts]


def detect_scored(
    texts: Sequence[str], among: Sequence[str] | None = None
) -> list[tuple[str, float]]:
    """Each text's most likely language and how sure py3langid is of it, from 0 to 1
    (its probability among the languages considered); ("", 0.0) for an empty text."""
    import math

    identifier = _identifier(tuple(sorted({base(x) for x in among})) if among else None)
    out = []
    for text in texts:
        if not text.strip():
            out.append(("", 0.0))
            continue
        ranked = identifier.rank(text)  # (language, log-probability), best first
        top = ranked[0][1]
        total = sum(math.exp(score - top) for _, score in ranked)
        out.append((ranked[0][0], 1.0 / total))
    return out


def in_language(texts: Sequence[str], lang: str, among: Sequence[str] | None = None) -> list[bool]:
    """Whether each text is detected as `lang` (an empty text counts as in it)."""
    want = base(lang)
    return [not found or found == want for found in detect(texts, among)]


@dataclass(frozen=True)
class OffTarget:
    """The share of non-empty hypotheses detected as another language than `lang`."""

    lang: str
    off: int
    scored: int  # non-empty hypotheses
    found: dict[str, int]  # the other languages detected, most frequent first
    among: tuple[str, ...] = ()  # the languages told apart (): all py3langid knows

    @property
    def rate(self) -> float:
        return 100.0 * self.off / self.scored if self.scored else 0.0

    @property
    def json(self) -> dict:
        return {
            "lang": self.lang,
            "rate": round(self.rate, 2),
            "off": self.off,
            "lines": self.scored,
            "found": self.found,
            "among": list(self.among) or None,
        }

    @property
    def text(self) -> str:
        others = ", ".join(f"{k} {v}" for k, v in list(self.found.items())[:5])
        among = f"among {', '.join(self.among)}" if self.among else "all languages"
        return (
            f"off-target ({self.lang}) = {self.rate:.1f}% ({self.off} of "
            f"{plural(self.scored, 'non-empty line')}{': ' + others if others else ''})"
            f"\tpy3langid, {among}"
        )


def check_languages(
    lang: str, among: Sequence[str] | None = None, the_models: bool = False
) -> None:
    """One line where `off_target(..., lang, among)` would fail, so that a caller can
    check before it translates: py3langid is not installed, does not know `lang` or
    one of `among` (`the_models`: they are a model's languages, not --among's), or
    `lang` is not among them."""
    known = _identifier(None).nb_classes
    such = f"it knows {len(known)} ISO 639-1 codes such as en, de"
    if base(lang) not in known:
        raise LangIdError(f"--lang {lang}: py3langid does not know it; {such}")
    named = f"the model's languages {', '.join(among or ())}" if the_models else "--among"
    unknown = sorted({x for x in among or () if base(x) not in known})
    if unknown:
        hint = "; give --among with the codes to tell apart, such as en,de" if the_models else ""
        raise LangIdError(f"{named}: py3langid does not know {', '.join(unknown)}; {such}{hint}")
    if among and base(lang) not in {base(x) for x in among}:
        raise LangIdError(f"--lang {lang} is not among {named if the_models else ', '.join(among)}")


def off_target(
    hypotheses: Sequence[str], lang: str, among: Sequence[str] | None = None
) -> OffTarget:
    """How many hypotheses are not in `lang`, and what they are in instead (detected
    `among` those languages when given; `lang` must be one of them: `check_languages`)."""
    check_languages(lang, among)
    found = [x for x in detect(hypotheses, among) if x]
    others = Counter(x for x in found if x != base(lang))
    return OffTarget(
        lang,
        sum(others.values()),
        len(found),
        dict(others.most_common()),
        tuple(sorted({base(x) for x in among})) if among else (),
    )

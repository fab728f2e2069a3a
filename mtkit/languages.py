"""Languages of a run: its translation directions, and the `<2xx>` tags that tell a
multilingual model which language to translate into (no torch).

A corpus may name its own `src_lang` / `tgt_lang` (`CorpusConfig`); the data section's
are the default. A run is *multilingual* when its training corpora go into more than
one target language: each source line then starts with its target's tag (Johnson et
al., 2017, as OPUS-MT does), a SentencePiece user-defined symbol, so it never splits,
with an id right after the fixed specials. A bilingual run has no tags, and its ids,
shards and outputs are what they always were.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from mtkit.errors import OptionError
from mtkit.hypothesis import Hypothesis

if TYPE_CHECKING:
    from mtkit.config import CorpusConfig, DataConfig


def tag(lang: str) -> str:
    """The tag of target language `lang`: <2de>."""
    return f"<2{lang}>"


def direction(corpus: CorpusConfig, data: DataConfig) -> tuple[str, str]:
    """A corpus's (source, target) languages: its own, else the data section's."""
    return corpus.src_lang or data.src_lang, corpus.tgt_lang or data.tgt_lang


def directions(data: DataConfig, split: str = "train") -> list[tuple[str, str]]:
    """The split's directions, each once, in the order its corpora give them."""
    return list(dict.fromkeys(direction(c, data) for c in data.corpora(split)))


def target_languages(data: DataConfig) -> list[str]:
    """The languages a multilingual run translates into (sorted); [] for a bilingual
    one, whose training corpora all go into one language."""
    targets = sorted({tgt for _, tgt in directions(data)})
    return targets if len(targets) > 1 else []


def tags(data: DataConfig) -> list[str]:
    """The run's tags, one per target language ([] for a bilingual run)."""
    return [tag(lang) for lang in target_languages(data)]


def source_tag(corpus: CorpusConfig, data: DataConfig) -> str:
    """What a corpus's source lines start with: its target's tag and a space in a
    multilingual run, "" in a bilingual one."""
    return f"{tag(direction(corpus, data)[1])} " if target_languages(data) else ""


def check_target(data: DataConfig, lang: str | None, option: str = "--tgt-lang") -> str:
    """The prefix a source line gets to be translated into `lang` (None: not given):
    its tag for a multilingual model, "" for a bilingual one. One line for a missing
    language on a multilingual model, or one the model does not translate into."""
    known = target_languages(data)
    if not known:
        if lang is not None and lang != data.tgt_lang:
            raise OptionError(f"{option} {lang}: this model translates {data.src_lang} into "
                              f"{data.tgt_lang} only", "tgt_lang")
        return ""
    if lang is None:
        raise OptionError(f"this model translates into {', '.join(known)}: give {option} "
                          f"with one of them", "tgt_lang")
    if lang not in known:
        raise OptionError(f"{option} {lang}: this model translates into {', '.join(known)}",
                          "tgt_lang")
    return f"{tag(lang)} "


def name(pair: tuple[str, str]) -> str:
    """A direction's name: ("en", "de") -> "en-de"."""
    return f"{pair[0]}-{pair[1]}"


def shares(pairs: dict[str, int], temperature: float) -> dict[str, float]:
    """Each direction's share of an epoch's pairs: its pairs ** (1 / temperature),
    normalized (1: as they are; larger: closer to uniform)."""
    weights = {d: n ** (1.0 / temperature) for d, n in pairs.items()}
    total = sum(weights.values())
    return {d: w / total for d, w in weights.items()}


def epoch_counts(pairs: dict[str, int], temperature: float) -> dict[str, int]:
    """How many pairs an epoch draws from each direction: its `shares` of all the pairs
    (the epoch keeps its size), rounded so that they add up; each direction at least 1."""
    total = sum(pairs.values())
    exact = {d: total * s for d, s in shares(pairs, temperature).items()}
    counts = {d: max(1, int(x)) for d, x in exact.items()}
    by_rest = sorted(exact, key=lambda d: exact[d] - int(exact[d]), reverse=True)
    for d in by_rest[: max(total - sum(counts.values()), 0)]:
        counts[d] += 1
    return counts


def untagged(hyps: list[Hypothesis]) -> list[Hypothesis]:
    """Hypotheses of a tagged source with their word links to the source as the user
    wrote it: the tag was source word 0, so links to it go and the others move down one."""
    return [h if not h.alignment else
            replace(h, alignment=tuple((s - 1, t) for s, t in h.alignment if s > 0))
            for h in hyps]

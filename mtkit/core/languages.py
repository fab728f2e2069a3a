"""Languages of a run: its translation directions, and the `<2xx>` tags that tell a
multilingual model which language to translate into (no torch).

A corpus may name its own `src_lang` / `tgt_lang` (`CorpusConfig`); the data section's
are the default. A run is *multilingual* when its training corpora go into more than
one target language: each source line then starts with its target's tag (Johnson et
al., 2017, as OPUS-MT does), a SentencePiece user-defined symbol, so it never splits,
with an id right after the fixed specials. With `model.lang_tag: target` the tag starts
the target line instead: the decoder's first token after bos, given as a forced prefix
when translating and taken off the output (mBART and NLLB put theirs there). A
bilingual run has no tags, and its ids, shards and outputs are what they always were.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from mtkit.core.configcheck import language_code_fault
from mtkit.core.errors import OptionError
from mtkit.core.hypothesis import Hypothesis

if TYPE_CHECKING:
    from mtkit.core.config import Config, CorpusConfig, DataConfig
    from mtkit.core.vocab import Vocab

# A piece is in a language's output vocabulary where that language's training text uses
# it at least this share as often (per token) as the language that uses it most: on the
# Multi30k recipe 3,757 of 12,000 pieces for French, 4,001 for German, and not "▁the"
# or "▁man", though 4 and 47 French training captions hold them.
OUTPUT_SHARE = 0.1


def tag(lang: str) -> str:
    """The tag of target language `lang`: <2de>."""
    return f"<2{lang}>"


def check_language_code(code: str, option: str = "--tgt-lang", field: str | None = None) -> str:
    """`code` when it can be a language's tag (one SentencePiece piece: ASCII letters,
    digits, - and _, `configcheck.LANGUAGE_CODE`), else an `OptionError` whose one line
    names `option` (`field`: the request field at fault, for `mtkit serve`). Config
    files are checked the same way when they load."""
    fault = language_code_fault(code)
    if fault:
        raise OptionError(f"{option} {fault}", field)
    return code


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


def bilingual_pair(data: DataConfig) -> tuple[str, str]:
    """A run's (source, target) when it has one target language: its training direction
    (the first, when several sources go into it), else the data section's."""
    found = directions(data)
    return found[0] if found else (data.src_lang, data.tgt_lang)


def tags(data: DataConfig) -> list[str]:
    """The run's tags, one per target language ([] for a bilingual run)."""
    return [tag(lang) for lang in target_languages(data)]


def source_tag(corpus: CorpusConfig, data: DataConfig, side: str = "source") -> str:
    """What a corpus's source lines start with: its target's tag and a space in a
    multilingual run whose tags go on the source `side` (`model.lang_tag`), else ""."""
    return (
        f"{tag(direction(corpus, data)[1])} " if target_languages(data) and side == "source" else ""
    )


def target_tag(corpus: CorpusConfig, data: DataConfig, side: str = "source") -> str:
    """What a corpus's target lines start with: its tag with `model.lang_tag: target`."""
    return (
        f"{tag(direction(corpus, data)[1])} " if target_languages(data) and side == "target" else ""
    )


TAG_START = re.compile(r"^<2[^>\s]*> ?")


def without_tag(text: str) -> str:
    """A line with the tag it starts with (if any) taken off."""
    return TAG_START.sub("", text, count=1)


def tag_ids(vocab: Vocab, data: DataConfig) -> frozenset[int]:
    """The ids of a multilingual run's tags in `vocab` (each is one piece)."""
    return frozenset(vocab.encode([t])[0][-1] for t in tags(data))


class Tagging(NamedTuple):
    """Where a request's tag goes (`tagging`): before its source line, or as the forced
    start of its output; both "" for a bilingual model."""

    source: str = ""
    target: str = ""


def tagging(cfg: Config, lang: str | None, option: str = "--tgt-lang") -> Tagging:
    """The tag a request into `lang` gets, on the side the model reads it (`check_target`
    says what is wrong with `lang`)."""
    prefix = check_target(cfg.data, lang, option)
    return Tagging(target=prefix) if cfg.model.lang_tag == "target" else Tagging(source=prefix)


def check_target(data: DataConfig, lang: str | None, option: str = "--tgt-lang") -> str:
    """The prefix a source line gets to be translated into `lang` (None: not given):
    its tag for a multilingual model, "" for a bilingual one. One line for a missing
    language on a multilingual model, or one the model does not translate into."""
    if lang is not None:
        check_language_code(lang, option, "tgt_lang")
    known = target_languages(data)
    if not known:
        src, tgt = bilingual_pair(data)
        if lang is not None and lang != tgt:
            raise OptionError(
                f"{option} {lang}: this model translates {src} into {tgt} only", "tgt_lang"
            )
        return ""
    if lang is None:
        raise OptionError(
            f"this model translates into {', '.join(known)}: give {option} with one of them",
            "tgt_lang",
        )
    if lang not in known:
        raise OptionError(
            f"{option} {lang}: this model translates into {', '.join(known)}", "tgt_lang"
        )
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


class Shards(Protocol):
    """What `output_vocabularies` reads of a training split (`data.shards.ShardDataset`)."""

    def directions(self) -> dict[str, np.ndarray]: ...  # direction -> its pair indices

    def id_counts(self, side: str, pairs: np.ndarray, size: int) -> np.ndarray: ...


def output_vocabularies(
    data: Shards,
    cfg: DataConfig,
    size: int,
    joint: bool = True,
    tags: frozenset[int] = frozenset(),
    share: float = OUTPUT_SHARE,
) -> dict[str, list[int]]:
    """For each language a multilingual run translates into, the ids (of a target
    vocabulary of `size`) its pieces are: the pieces its training text uses at least
    `share` as often per token as the language that uses them most ({} for a bilingual
    run). The text is both sides of the pairs with a `joint` vocabulary, the target side
    otherwise (source ids are another vocabulary's); the `tags` ids are no language's.
    Translation keeps its outputs to them (`decode.lang_vocab`), which stops a zero-shot
    direction sliding into English."""
    into = target_languages(cfg)
    if not into:
        return {}
    pairs = {name(p): p for p in directions(cfg)}
    counts: dict[str, np.ndarray] = {}
    for direction, rows in data.directions().items():
        if direction not in pairs:
            continue
        for side, lang in zip(("src", "tgt"), pairs[direction], strict=True):
            if side == "tgt" or joint:
                n = data.id_counts(side, rows, size)
                counts[lang] = counts[lang] + n if lang in counts else n
    if not counts:  # a shard that records no directions of this config
        return {}
    for n in counts.values():
        n[sorted(tags)] = 0
    rates = {lang: n / max(int(n.sum()), 1) for lang, n in counts.items()}
    top = np.max(np.stack(list(rates.values())), axis=0)
    return {
        lang: np.flatnonzero((counts[lang] > 0) & (rates[lang] >= share * top)).tolist()
        for lang in into
        if lang in counts
    }


def tag_end(ids: Sequence[int], tags: frozenset[int]) -> int:
    """Where an output whose forced start is one of the `tags` (the first token, or the
    second after a lone "▁") goes on past it; 0 when neither of the two is a tag."""
    return next((k + 1 for k, i in enumerate(ids[:2]) if int(i) in tags), 0)


def untagged(
    hyps: list[Hypothesis], source: bool = True, target: frozenset[int] = frozenset()
) -> list[Hypothesis]:
    """Hypotheses as the user asked for them, not as the model read and wrote them. With
    a `source` tag, which was source word 0, word links to it go and the others move
    down one. With the tag as the output's forced start (`target`: the tag ids), its
    tokens (a lone "▁" may come first) go, and so does target word 0 of the links."""
    out = []
    for h in hyps:
        links = h.alignment
        if source and links:
            links = tuple((s - 1, t) for s, t in links if s > 0)
        cut = tag_end(h.tokens, target)
        if cut and links:
            links = tuple((s, t - 1) for s, t in links if t > 0)
        out.append(replace(h, tokens=h.tokens[cut:], alignment=links) if cut or source else h)
    return out

"""What every engine is: the protocol the session and the server translate through
(`Engine`), and its shared half (`EngineBase`), what every engine does to its input before
the search: set empty lines aside, encode and truncate the others, encode target prefixes
and constraints, refuse the options (and the constraints) it cannot honour."""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from mtkit.core.errors import OptionError
from mtkit.core.hypothesis import Hypothesis
from mtkit.core.languages import tag
from mtkit.core.search_options import (
    BATCH_TOKENS,
    MAX_CONSTRAINTS,
    Capabilities,
    SearchOptions,
    check,
    flag,
)
from mtkit.core.terms import shorten
from mtkit.core.textio import blank
from mtkit.core.vocab import EOS, UNK, Vocab

log = logging.getLogger(__name__)
TAG_PIECE = re.compile(r"<2[^>\s]*>|>>[^<\s]*<<")  # a target-language tag as one piece


class Engine(Protocol):
    """What every engine does: source lines in, hypotheses out, in input order."""

    src_vocab: Vocab
    tgt_vocab: Vocab
    capabilities: Capabilities
    config: Any  # the checkpoint's `mtkit.core.config.Config`: decoding defaults, languages
    steps: list[int | None]  # each model's training step (None: averaged, or unknown)
    weights: list[str]  # what each model's weights are: "step 900", "the average of ..."
    batch_tokens: int  # the batch budget where none is given (decode.batch_tokens, or the GPU's)

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        """One line for anything in `options` this engine cannot do."""

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Source ids of each line, truncated to the model's positions."""

    def close(self) -> None:
        """Let go of what the engine runs beside its process (helper processes)."""

    def translate(
        self,
        lines: list[str],
        options: SearchOptions,
        done: Callable[[int], None] | None = None,
        prefixes: list[str] | None = None,
        *,
        batch_tokens: int = BATCH_TOKENS,
        constraints: list[list[tuple[str, ...]]] | None = None,
        links: list[bool] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for each line (`nbest`), in input order; an empty line gets empty
        hypotheses; a line's outputs start with its target prefix, when given, and
        contain one phrase of each of its `constraints` (`mtkit.core.terms`: alternatives),
        when given; `done(n)` is told as lines finish. With `options.alignments`, `links`
        says which lines want their word links (None: every one); the others' hypotheses
        have none."""

    def constraint_errors(
        self, lines: list[str], constraints: list[list[tuple[str, ...]]], options: SearchOptions
    ) -> list[str]:
        """For each line, why its constraints cannot be met ("" where they can): more
        than `MAX_CONSTRAINTS`, or a phrase longer than the line's length limit."""

    def describe(self) -> dict:
        """What runs the search, for `mtkit serve`'s /v1/info: engine, models,
        parameters (None where unknown), device."""


class EngineBase:
    """The shared half of an engine (`Engine`). Subclasses set
    `src_vocab`, `tgt_vocab`, `max_positions`, `capabilities`, `config`, `steps`, and
    search in `translate`."""

    src_vocab: Vocab
    tgt_vocab: Vocab
    max_positions: int
    capabilities: Capabilities

    def __init__(self) -> None:
        self._truncated: set[str] = set()  # the kinds of text already warned about

    def check(self, options: SearchOptions, spell: Callable[[str], str] = flag) -> None:
        """One line for anything in `options` this engine cannot do."""
        check(options, self.capabilities, spell)

    def close(self) -> None:
        """Let go of what the engine runs beside its process (the PyTorch engine's helper
        processes, `mtkit.engines.workers`); it stays usable. Nothing here."""

    @property
    def max_src_tokens(self) -> int:
        return self.max_positions - 1  # room for eos

    @property
    def batch_tokens(self) -> int:
        """The batch budget where none is given: the checkpoint's decode.batch_tokens
        (the PyTorch engine sizes it for a GPU)."""
        return self.config.decode.batch_tokens

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self._cut(self.src_vocab.encode(lines), self.max_src_tokens, "input lines")

    def _cut(self, ids: list[list[int]], limit: int, what: str) -> list[list[int]]:
        """Each of `ids` cut to `limit` pieces; the first cut of each kind is logged."""
        if all(len(x) <= limit for x in ids):
            return ids
        if what not in self._truncated:
            log.warning(
                "%s longer than %d subwords are truncated (model.max_positions=%d)",
                what,
                limit,
                self.max_positions,
            )
            self._truncated.add(what)
        return [x[:limit] for x in ids]

    def prepare(
        self,
        lines: list[str],
        opts: SearchOptions,
        done: Callable[[int], None],
        prefixes: list[str] | None,
        constraints: list[list[tuple[str, ...]]] | None = None,
    ) -> tuple[list[list[Hypothesis]], list[int], list[list[int]], list[list[int]] | None]:
        """Empty lines answered (an empty hypothesis each, which has not met the line's
        `constraints` where it has some; `done` is told), the others encoded: the results
        so far, the indices of the lines left, their source ids and their target prefix
        ids (None without prefixes)."""
        out: list[list[Hypothesis]] = [[] for _ in lines]
        todo = [i for i, line in enumerate(lines) if not blank(line)]
        empty = Hypothesis([], 0.0, 0.0, () if opts.alignments else None)
        for i in set(range(len(lines))) - set(todo):
            unmet = bool(constraints and constraints[i])
            out[i] = [replace(empty, met=False) if unmet else empty] * opts.nbest
        done(len(lines) - len(todo))
        ids = self.encode([lines[i] for i in todo]) if todo else []
        forced = (
            self._cut(
                self.tgt_vocab.encode([prefixes[i] for i in todo]),
                self.max_src_tokens - 1,
                "target prefixes",
            )  # room for eos
            if prefixes and todo
            else None
        )
        return out, todo, ids, forced

    def output_groups(
        self,
        ids: list[list[int]],
        forced: list[list[int]] | None,
        opts: SearchOptions,
        required: list[list[int]] | None = None,
    ) -> list[tuple[list[int], list[int]]]:
        """The encoded lines (indices into `ids`) in groups searched with one output
        vocabulary each: (the target ids banned, [] for none; the lines). With
        `opts.lang_vocab` on a multilingual model, a line into a language keeps to that
        language's pieces (`Vocab.languages`), the specials, and its own target prefix
        and `required` ids (its constraints): lines that share all of these are a group.
        A line's language is its tag: the target prefix's or the source's."""
        languages = self.tgt_vocab.languages if opts.lang_vocab else {}
        if not languages:
            return [([], list(range(len(ids))))]
        target, source = (_tag_ids(vocab, languages) for vocab in (self.tgt_vocab, self.src_vocab))
        groups: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
        for k, line in enumerate(ids):
            own = (forced[k] if forced else []) + (required[k] if required else [])
            found = [target.get(i) for i in (forced[k][:2] if forced else [])] + [
                source.get(i) for i in line[:2]
            ]
            lang = next((x for x in found if x), None)
            groups.setdefault((lang, tuple(sorted(set(own))) if lang else ()), []).append(k)
        everything = set(range(len(self.tgt_vocab)))
        return [
            (
                []
                if lang is None
                else sorted(everything - set(languages[lang]) - set(own) - set(range(EOS + 1))),
                lines,
            )
            for (lang, own), lines in groups.items()
        ]

    def output_limit(self, src_len: int, opts: SearchOptions) -> int:
        """The longest output of a line of `src_len` source ids, as the search sets it
        (`beam.max_lengths`): a * (src_len + 1) + b tokens (eos counts as a source
        token), from 1 to the model's positions."""
        top = self.max_positions - 1
        a, b = min(opts.max_len_a, top), min(opts.max_len_b, top)  # huge: no overflow
        return min(max(math.floor(a * (src_len + 1) + b), 1), top)

    def _phrase_ids(self, constraints: list[list[tuple[str, ...]]]) -> dict[str, list[int]]:
        """Each phrase's target ids, encoded as it reads inside a sentence (SentencePiece
        puts the word-start marker before it); [] for one that cannot be searched for
        (`_unusable`)."""
        phrases = sorted({p for line in constraints for c in line for p in c})
        ids = dict(zip(phrases, self.tgt_vocab.encode(phrases) if phrases else [], strict=True))
        return {p: [] if self._unusable(x) else x for p, x in ids.items()}

    def _unusable(self, ids: list[int]) -> str:
        """Why a phrase of these target ids cannot be searched for, or "": it encodes to
        nothing, holds a piece the vocabulary lacks (unk), or a control piece that no
        output holds as text: a language tag, bos, eos (`_control_ids`)."""
        if not ids or UNK in ids:
            return "it has characters the target vocabulary lacks, or none it keeps"
        if not self._control_ids.isdisjoint(ids):
            return "it holds a language tag or another control piece, which is no text"
        return ""

    @functools.cached_property
    def _control_ids(self) -> frozenset[int]:
        """The target ids that are no text: the specials (pad, unk, bos, eos) and the
        language tags (a multilingual run's <2xx>, an imported model's >>xx<<)."""
        tags = {
            i
            for i in range(EOS + 1, len(self.tgt_vocab))
            if TAG_PIECE.fullmatch(self.tgt_vocab.piece(i))
        }
        return frozenset(range(EOS + 1)) | frozenset(tags)

    def constraint_ids(
        self,
        sources: list[list[int]],
        constraints: list[list[tuple[str, ...]]],
        opts: SearchOptions,
        numbers: list[int],
    ) -> list[list[list[list[int]]]]:
        """The constraints of lines already encoded (`sources`, from `prepare`) as target
        ids (line -> constraint -> alternative -> ids), without the phrases that cannot be
        searched for (`_phrase_ids`); first, one line for the first line whose
        constraints cannot be (`constraint_errors`), named by its number in `numbers`."""
        ids = self._phrase_ids(constraints)
        for src, line, number in zip(sources, constraints, numbers, strict=True):
            why = self._constraint_error(
                line, ids, self.output_limit(len(src), opts), len(src), opts
            )
            if why:
                raise OptionError(f"line {number}: {why}", "constraints")
        return [
            [alts for c in line if (alts := [ids[p] for p in c if ids[p]])] for line in constraints
        ]

    def constraint_errors(
        self, lines: list[str], constraints: list[list[tuple[str, ...]]], opts: SearchOptions
    ) -> list[str]:
        """For each line, why its constraints cannot be searched for ("" where they
        can): more than `MAX_CONSTRAINTS` of them, one whose every phrase encodes to
        nothing or holds characters the target vocabulary lacks, or one whose shortest
        phrase is longer than the line's output limit (`output_limit`)."""
        sources, phrase_ids = self.encode(lines), self._phrase_ids(constraints)
        return [
            self._constraint_error(
                line, phrase_ids, self.output_limit(len(src), opts), len(src), opts
            )
            for src, line in zip(sources, constraints, strict=True)
        ]

    def _constraint_error(
        self,
        line: list[tuple[str, ...]],
        ids: dict[str, list[int]],
        limit: int,
        src_len: int,
        opts: SearchOptions,
    ) -> str:
        if len(line) > MAX_CONSTRAINTS:
            return f"{len(line)} constraints; a line may have at most {MAX_CONSTRAINTS}"
        for phrases in line:
            usable = [ids[p] for p in phrases if ids[p]]
            shown = repr(shorten(phrases[0]))  # a runaway phrase is not echoed whole
            if not usable:
                why = self._unusable(self.tgt_vocab.encode([phrases[0]])[0])
                return f"the constraint {shown} cannot be searched for: {why}"
            if min(map(len, usable)) > limit:
                return (
                    f"the constraint {shown} is {min(map(len, usable))} subwords, "
                    f"longer than the line's output limit of {limit} (--max-len-a "
                    f"{opts.max_len_a:g} x {src_len + 1} source subwords + --max-len-b "
                    f"{opts.max_len_b})"
                )
        return ""


def _tag_ids(vocab: Vocab, languages: dict[str, list[int]]) -> dict[int, str]:
    """{the id of `<2xx>`: xx} for the languages whose tag is one of `vocab`'s pieces."""
    ids = {vocab.piece_id(tag(lang)): lang for lang in languages}
    return {i: lang for i, lang in ids.items() if i != UNK and vocab.piece(i) == tag(lang)}

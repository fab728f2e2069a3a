"""A translation session: lines (or jsonl requests) in, `Translation`s out, in order.

`Session` is what every surface builds once and translates through (the Python API,
`translate`, `eval -m`, `mtkit run`'s test set, every route of `mtkit serve`): the engine,
the search options (the checkpoint's decode section with the caller's overrides), a
glossary, whether lines are split into sentences, the language to translate into and the
batch budget, checked once when it is opened (`Session.open`), each error naming an
option the caller's way (the CLI's --beam, the API's beam, the server's fields).
`Session.translate_texts` translates texts or documents of a format, as each surface
asks.

`translate_requests` is the one path a session's texts take: each request gets its target
language's tag, a line of several sentences is split into them (`mtkit.documents.sentences`)
and joined back, each line's constraints (its own, a file's, a glossary's) are checked
against what the engine can search for, the lines go to the engine
(`mtkit.engines.base.Engine`, which sorts and batches them) and come back as
`mtkit.core.translation.Translation`s.

`translate_stream` drives it over a byte stream: whatever lines are available (so it works
interactively and in a pipe), exactly one output line per input line (n lines with
`nbest` n), in input order, flushed after each chunk. Empty lines give empty lines
without running the model.

Three callers search with the engine itself, each for what a session's output does not
hold: `mtkit distill` (a teacher's translation of training sentences, already one
sentence each and cleaned, recorded with each hypothesis's pieces and log-probability
cost, with `distill.beam`), training's validation (greedy, on token ids, for the
checkpoint's BLEU) and `mtkit explain` (the model's attention, step by step).

The constraint rule, here once for every surface (the API, `translate`, `eval -m`,
`mtkit serve`): options that cannot search for constraints at all (sampling, a beam of
one, an engine without constrained search) are refused for every source that gives some,
a glossary too (`check_constraint_options`); on a line, its own constraints (a file's, a
jsonl record's, a request's) that cannot be searched for are an error, a glossary's are
dropped from that line with a warning (`searchable`, with `constraint_errors` saying why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, TextIO

from mtkit.core.errors import OptionError
from mtkit.core.languages import check_target, tag_ids, tagging, untagged
from mtkit.core.search_options import (
    BATCH_TOKENS,
    SearchOptions,
    check_constraints,
    check_value,
    constraints_need,
    flag,
)
from mtkit.core.terms import Glossary, combine
from mtkit.core.textio import (
    TEXT,
    OutputFormat,
    Request,
    blank,
    format_lines,
    line_name,
    parse_line,
    read_chunks,
)
from mtkit.core.translation import Anchored, Translation, joined
from mtkit.documents import sentences
from mtkit.documents.elements import PLAIN, MarkupRules
from mtkit.engines.base import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Session:
    """One caller's way of translating with one engine: its search options, a glossary
    whose terms constrain the lines holding them, whether a line of several sentences is
    translated sentence by sentence, the language a multilingual model translates into
    (None: a bilingual model's, or each jsonl record's own), the batch budget, and what
    the caller says of a markup document's elements (`markup`: DeepL's tag options, an
    ITS rules file; `mtkit.documents.elements.MarkupRules`). `spell` names an option in
    an error as the caller gave it (`flag`: --beam; the API's keyword: beam). Built
    checked by `open`; the constructor takes values already checked (the server's)."""

    engine: Engine
    opts: SearchOptions
    glossary: Glossary | None = None
    split: bool = False
    tgt_lang: str | None = None
    batch_tokens: int = BATCH_TOKENS
    spell: Callable[[str], str] = flag
    name_line: Callable[[int], str] = line_name  # a text in an error: "line 3" (the server's
    # "constraints.2": the field its constraints came in)
    markup: MarkupRules = PLAIN
    retranslate: bool = False  # a bilingual file's filled targets translated again (XLIFF)

    @classmethod
    def open(
        cls,
        engine: Engine,
        given: Mapping[str, Any] | None = None,
        *,
        spell: Callable[[str], str] = flag,
        decode: Any = None,
        glossary: Glossary | None = None,
        constrained_by: Iterable[str] = (),
        tgt_lang: str | None = None,
        target: bool = True,
        split: bool | None = None,
        batch_tokens: int | None = None,
        markup: Mapping[str, Any] | None = None,
        retranslate: bool = False,
    ) -> Session:
        """A session whose every setting is checked, once, each error one line naming the
        option by `spell`: the search options are `decode`'s (a `DecodeConfig`; None: the
        checkpoint's) with the `given` ones (None: not given) instead
        (`SearchOptions.from_config`), which the engine must be able to honour; each of
        `constrained_by` (what gives every line constraints: --constraints, --glossary)
        must find options that can search for constraints (`check_constraint_options`);
        `tgt_lang` must be a language the model translates into (checked where given, and
        where not given when `target`: a jsonl stream's records may name their own).
        `split` and `batch_tokens`: None takes `decode`'s split and the engine's budget.
        `markup`: the markup options given (ignore_tags, non_splitting_tags,
        splitting_tags, outline_detection, its_rules; None: not given), checked by
        `MarkupRules.checked`. `retranslate`: a bilingual file's (XLIFF) targets that a
        translator filled are translated again (checked against the format when it is
        known, `formats.check_retranslate`)."""
        decode = engine.config.decode if decode is None else decode
        opts = SearchOptions.from_config(decode, spell, **(given or {}))
        engine.check(opts, spell)
        check_constraint_options(engine, opts, constrained_by, spell)
        if tgt_lang is not None or target:
            check_target(engine.config.data, tgt_lang, spell("tgt_lang"))
        if batch_tokens is None:
            batch_tokens = engine.batch_tokens
        else:
            check_value("batch_tokens", batch_tokens, spell)
        split = decode.split if split is None else split
        rules = MarkupRules.checked(**(markup or {}), spell=spell)
        return cls(
            engine,
            opts,
            glossary,
            split,
            tgt_lang,
            batch_tokens,
            spell,
            markup=rules,
            retranslate=retranslate,
        )

    def request(self, text: str) -> Request:
        """`text` as a request into the session's language (`into_language`)."""
        return into_language(Request(text), self.engine, self.tgt_lang, flag=self.spell("tgt_lang"))

    def translate(
        self,
        requests: list[Request],
        *,
        constraints: list[list[tuple[str, ...]]] | None = None,
    ) -> list[list[Translation]]:
        """The translations of each request, in order (`translate_requests`, with the
        session's options, glossary, split and budget); `constraints`: each request's
        besides its own."""
        return translate_requests(
            self.engine,
            requests,
            self.opts,
            constraints=constraints,
            glossary=self.glossary,
            split=self.split,
            batch_tokens=self.batch_tokens,
            name_line=self.name_line,
        )

    def translate_texts(
        self,
        texts: list[str],
        format: str = "text",
        constraints: list[list[tuple[str, ...]]] | None = None,
    ) -> list[Translation]:
        """One `Translation` per text, in order: a line of text (its n-best after the
        first in `alternatives`), or a document in `format` (a name in
        `mtkit.documents.formats.FORMATS`), whose texts of every document go through the
        session together, round by round (`translate_documents`), with word alignments
        to carry its tags by. `constraints`: each text's, for text alone (a document's
        terms go in a glossary). What every surface calls: the API, `translate`, the
        server's routes."""
        from mtkit.documents.formats import (
            FORMATS,
            binary_refused,
            check_retranslate,
            check_rules,
            translate_documents,
        )

        if format not in ("text", *FORMATS):
            raise OptionError(
                f"{self.spell('format')} must be one of {', '.join(('text', *FORMATS))}, "
                f"got {format!r}",
                "format",
            )
        check_rules(format, self.markup)
        check_retranslate(format, self.retranslate, self.spell("retranslate"))
        if format != "text" and FORMATS[format].binary:
            raise OptionError(binary_refused(format), "format")
        if format == "text":
            requests = [self.request(t) for t in texts]
            found = self.translate(requests, constraints=constraints)
            return [
                _with_alternatives(ts) if ts else Translation(r.src, "", 0.0, 0.0)
                for r, ts in zip(requests, found, strict=True)
            ]
        self.check_document_options(format)
        if constraints is not None:
            raise OptionError(
                f"{self.spell('constraints')} are for text; a document's terms go in a glossary",
                "constraints",
            )
        aligned = replace(
            self, opts=replace(self.opts, alignments=True), markup=PLAIN, retranslate=False
        )
        target = self.tgt_lang or self.engine.config.data.tgt_lang or None  # (xliff names it)
        return translate_documents(
            texts, format, aligned.translate_texts, target, self.markup, self.retranslate
        )

    def check_document_options(self, format: str) -> None:
        """One line where the session's options are for text alone (n-best)."""
        if self.opts.nbest > 1:  # (as `translate --nbest --format html`)
            raise OptionError(
                f"{self.spell('nbest')} is for text; format {format} writes a document", "nbest"
            )

    def translate_data(self, data: bytes, format: str) -> bytes:
        """A document file's bytes (of `format`, a name in
        `mtkit.documents.formats.FORMATS`) translated: read in the encoding it declares
        (or by its byte-order mark; UTF-8 else), its texts translated (`translate_texts`),
        written back in that encoding. What `translate -i FILE` and the document routes
        call. A file format's (`binary`: docx, pptx, xlsx, odt, odp, epub) bytes are the
        zip they are, translated part by part (`translate_files`)."""
        from mtkit.core.textio import read_document
        from mtkit.documents.formats import (
            FORMATS,
            check_retranslate,
            check_rules,
            translate_files,
        )

        document = FORMATS[format]
        if document.binary:
            check_rules(format, self.markup)
            check_retranslate(format, self.retranslate, self.spell("retranslate"))
            self.check_document_options(format)
            aligned = replace(self, opts=replace(self.opts, alignments=True), markup=PLAIN)
            (translated,) = translate_files([data], format, aligned.translate_texts)
            return translated
        encoding = document.encoding(data)
        (result,) = self.translate_texts([read_document(data, encoding)], format)
        return document.written(result.text, encoding)

    def stream(
        self,
        source: BinaryIO,
        sink: TextIO,
        done: Callable[[int], None] | None = None,
        prefixes: list[str] | None = None,
        *,
        output: OutputFormat = TEXT,
        constraints: list[list[tuple[str, ...]]] | None = None,
        first_line: int = 0,
    ) -> int:
        """Every line of `source` translated to `sink` (`translate_stream`); returns the
        number of input lines. Each line's `constraints` (one list per line of `source`,
        which is then seekable) are checked before anything is written
        (`check_constraint_lines`). `first_line`: the input's lines before `source`'s (a
        rank's share of a file, `mtkit.engines.ranks`): how lines are numbered."""
        if constraints is not None:
            check_constraint_lines(self.engine, source, constraints, self.opts, first_line)
        return translate_stream(
            self.engine,
            source,
            sink,
            self.opts,
            done,
            prefixes,
            output=output,
            batch_tokens=self.batch_tokens,
            constraints=constraints,
            glossary=self.glossary,
            tgt_lang=self.tgt_lang,
            split=self.split,
            first_line=first_line,
        )


def translate_requests(
    translator: Engine,
    requests: list[Request],
    opts: SearchOptions,
    *,
    prefixes: list[str] | None = None,
    constraints: list[list[tuple[str, ...]]] | None = None,
    glossary: Glossary | None = None,
    split: bool = False,
    batch_tokens: int = BATCH_TOKENS,
    done: Callable[[int], None] | None = None,
    count: int = 0,
    jsonl: bool = False,
    name_line: Callable[[int], str] = line_name,
) -> list[list[Translation]]:
    """The translations of each request (`nbest` of them; none for a request with an
    error), in order; a jsonl request whose own constraints cannot be searched for gets
    its error in `requests` (which is updated in place). `prefixes`, `constraints`: each
    request's target prefix and constraints besides its own; a `glossary` adds what its
    source terms require, found per sentence. With `split`, a request with no prefix and
    no constraints of its own is translated sentence by sentence
    (`mtkit.documents.sentences`) and joined back.
    `count`: the lines before these (how messages number them, by `name_line`); `jsonl`:
    a request's own constraints that cannot be searched for are its error, not one line."""
    rows, line_of, row_given, linked = [], [], [], []
    src_lang = translator.config.data.src_lang
    for i, request in enumerate(requests):
        given = constraints[i] if constraints is not None else []
        if prefixes is not None:
            request = replace(request, prefix=prefixes[i])
        spans, parts = [(0, len(request.src))], [request.src]
        if split and not (request.error or request.prefix or given or request.constraints):
            spans = sentences.sentence_spans(request.src, src_lang) or spans
            parts = [request.src[start:end] for start, end in spans]
        for k, part in enumerate(parts):
            rows.append(replace(request, src=part))
            row_given.append(given)
            line_of.append(i)
            linked.append(_wants_links(request.src, spans, k))
    rows, wanted = searchable(
        translator,
        rows,
        row_given if constraints is not None else None,
        glossary,
        opts,
        count,
        jsonl,
        line_of,
        name_line,
    )
    for row, line in zip(rows, line_of, strict=True):
        if row.error:  # (a line whose own constraints cannot be: never split) its error
            requests[line] = row
    forced = [r.target_tag + r.prefix for r in rows]
    hyps = translator.translate(
        [r.text for r in rows],
        opts,
        done if len(rows) == len(requests) else None,
        forced if any(forced) else None,
        batch_tokens=batch_tokens,
        constraints=wanted,
        links=linked if opts.alignments and not all(linked) else None,
    )
    if done is not None and len(rows) != len(requests):
        done(len(requests))
    found: list[list[list[Translation]]] = [[] for _ in requests]
    for row, line, row_hyps in zip(rows, line_of, hyps, strict=True):
        if row_hyps and row_hyps[0].met is False:
            log.warning(
                "%s: %s",
                line_name(count + line, jsonl),
                "the source is empty, and so is its translation: its constraints are not met"
                if blank(row.text)
                else "no translation met all its constraints within the length "
                "limit; it gets the best unconstrained one",
            )
        if row.tag or row.target_tag:
            row_hyps = untagged(row_hyps, bool(row.tag), _tag_ids(translator, row))
        found[line].append([Translation.of(row.src, h, translator.tgt_vocab) for h in row_hyps])
    tgt_lang = translator.config.data.tgt_lang
    out = []
    for request, parts in zip(requests, found, strict=True):
        if len(parts) == 1:
            out.append(parts[0])
            continue
        between = sentences.separator(request.tgt_lang or tgt_lang)
        out.append(
            [
                joined(request.src, [p[k] for p in parts], between)
                for k in range(min(map(len, parts)))
            ]
        )
    return out


def _wants_links(text: str, spans: list[tuple[int, int]], k: int) -> bool:
    """Whether sentence `k` of `text` (at `spans`) wants word links: always, unless the
    text is `Anchored` and no anchor touches the sentence or the gap before it."""
    if not isinstance(text, Anchored):
        return True
    lo = spans[k - 1][1] if k else 0
    hi = spans[k][1] if k + 1 < len(spans) else len(text)
    return text.touched(lo, hi)


def translate_stream(
    translator: Engine,
    source: BinaryIO,
    sink: TextIO,
    opts: SearchOptions,
    done: Callable[[int], None] | None = None,
    prefixes: list[str] | None = None,
    *,
    output: OutputFormat = TEXT,
    batch_tokens: int = BATCH_TOKENS,
    constraints: list[list[tuple[str, ...]]] | None = None,
    glossary: Glossary | None = None,
    tgt_lang: str | None = None,
    split: bool = False,
    first_line: int = 0,
) -> int:
    """Translate every line of `source` to `sink`; returns the number of input lines.
    In jsonl format the input lines are JSON records too (`parse_line`). `prefixes`
    and `constraints`: a target prefix and constraints for each input line (text
    format); a `glossary` adds the constraints its source terms require. `tgt_lang`:
    the language a multilingual model translates into (a jsonl record's own first).
    `split`: a line of several sentences is translated sentence by sentence
    (`translate_requests`). `done(n)` is called as lines are finished (a progress bar).
    `first_line`: the lines before `source`'s, as messages and jsonl records number them."""
    count, jsonl = 0, output.kind == "jsonl"
    for lines in read_chunks(source, continued=first_line > 0):
        requests = [into_language(parse_line(x, jsonl), translator, tgt_lang, jsonl) for x in lines]
        results = translate_requests(
            translator,
            requests,
            opts,
            prefixes=prefixes[count : count + len(lines)] if prefixes is not None else None,
            constraints=constraints[count : count + len(lines)]
            if constraints is not None
            else None,
            glossary=glossary,
            split=split,
            batch_tokens=batch_tokens,
            done=done,
            count=first_line + count,
            jsonl=jsonl,
        )
        out = []
        for offset, (request, translations) in enumerate(zip(requests, results, strict=True)):
            index = first_line + count + offset
            out.extend(format_lines(index, request, translations, opts, output))
        sink.write("".join(x + "\n" for x in out))
        sink.flush()
        count += len(lines)
    return count


def _tag_ids(translator: Engine, request: Request) -> frozenset[int]:
    """The tag ids an output starting with a forced tag is cut after (none without)."""
    return (
        tag_ids(translator.tgt_vocab, translator.config.data) if request.target_tag else frozenset()
    )


def into_language(
    request: Request,
    translator: Engine,
    tgt_lang: str | None,
    jsonl: bool = False,
    flag: str = "--tgt-lang",
) -> Request:
    """The request with its target language's tag (`languages.tagging`: a multilingual
    model's, before the source or as the output's start; nothing for a bilingual one). A
    language the model lacks, or none for a multilingual model, is the record's error in
    jsonl and one line (naming `flag`) otherwise."""
    if request.error or blank(request.src):
        return request
    option = flag if not jsonl or tgt_lang else f'{flag} or "tgt_lang"'
    try:
        placed = tagging(
            translator.config,
            request.tgt_lang or tgt_lang,
            "tgt_lang" if jsonl and request.tgt_lang else option,
        )
    except OptionError as e:
        if not jsonl:
            raise
        return replace(request, src="", error=str(e))
    return replace(request, tag=placed.source, target_tag=placed.target) if any(placed) else request


def line_constraints(
    requests: list[Request],
    given: list[list[tuple[str, ...]]] | None,
    glossary: Glossary | None = None,
) -> list[list[tuple[str, ...]]] | None:
    """Each request's constraints: its own (jsonl), the `given` ones (a constraints
    file), and those its source terms require in the `glossary`; None if none has any
    (a request with an error has none of its own)."""
    wanted = [[] if r.error else list(r.constraints) for r in requests]
    if given is not None:
        wanted = combine(wanted, given)
    if glossary is not None:
        wanted = combine(wanted, [glossary.constraints(r.src) for r in requests])
    return wanted if any(wanted) else None


def searchable(
    translator: Engine,
    requests: list[Request],
    given: list[list[tuple[str, ...]]] | None,
    glossary: Glossary | None,
    opts: SearchOptions,
    count: int = 0,
    jsonl: bool = False,
    lines: list[int] | None = None,
    name_line: Callable[[int], str] = line_name,
) -> tuple[list[Request], list[list[tuple[str, ...]]] | None]:
    """The requests and each one's constraints, with those that cannot be searched for
    (`constraint_errors`) dealt with by the rule: a line's own constraints (a file's, its
    jsonl record's, an API call's) are its error record in jsonl, and one line otherwise
    (`count` lines came before this chunk; a file's were checked before anything was
    written: `check_constraint_lines`); a glossary's are dropped from that line with a
    warning, so a stream never stops on a term. `lines`: the input line each request is
    part of (a sentence of a split line is one request), counted from the chunk's start
    (None: one request a line); `name_line`: how the one line names it."""
    at = [count + (lines[i] if lines is not None else i) for i in range(len(requests))]
    own = line_constraints(requests, given)
    wanted = line_constraints(requests, given, glossary)
    if wanted is None:
        return requests, None
    errors = constraint_errors(translator, [r.text for r in requests], wanted, opts)
    if own is not None and any(errors):
        bad = [i for i, why in enumerate(errors) if why and own[i]]
        mine = constraint_errors(
            translator, [requests[i].text for i in bad], [own[i] for i in bad], opts
        )
        for i, why in zip(bad, mine, strict=True):
            if why and not jsonl:
                raise OptionError(f"{name_line(at[i])}: {why}", "constraints")
            if why:
                requests[i] = replace(requests[i], src="", error=f"constraints: {why}")
                wanted[i] = []
    for i, why in enumerate(errors):
        if why and wanted[i] and not requests[i].error:
            log.warning("%s: the glossary's terms are left out: %s", line_name(at[i], jsonl), why)
            wanted[i] = own[i] if own is not None else []
    return requests, wanted if any(wanted) else None


def check_constraint_options(
    translator: Engine,
    opts: SearchOptions,
    given: Iterable[str],
    spell: Callable[[str], str] = flag,
) -> None:
    """One line where `opts` on this engine cannot search for constraints at all
    (`constraints_need`), naming the first source in `given` (--constraints, --glossary,
    a request's field) as "--glossary needs ...": checked before anything is translated,
    a glossary's whether or not a line holds one of its terms."""
    for name in given:
        check_constraints(opts, translator.capabilities, name, spell)


def constraint_errors(
    translator: Engine,
    texts: list[str],
    constraints: list[list[tuple[str, ...]]],
    opts: SearchOptions,
) -> list[str]:
    """For each line (the text the model reads), why its constraints cannot be searched
    for ("" where they can, or it has none): by these options on this engine
    (`constraints_need`: beam search with a beam of two or more, on an engine that has
    it), or on this line (`Engine.constraint_errors`: too many, a phrase the target
    vocabulary cannot spell, one longer than the line's output limit)."""
    need = constraints_need(opts, translator.capabilities)
    if need:  # no line's constraints can be searched for
        return [f"searching for them needs {need}" if c else "" for c in constraints]
    return translator.constraint_errors(texts, constraints, opts)


def check_constraint_lines(
    translator: Engine,
    source: BinaryIO,
    constraints: list[list[tuple[str, ...]]],
    opts: SearchOptions,
    first_line: int = 0,
) -> None:
    """One line for the first input line (of `source`, which is read and rewound) whose
    constraints (one list per line) cannot be searched for (`constraint_errors`): checked
    before anything is written. (A glossary's terms never stop a translation:
    `searchable`.) `first_line`: the input's lines before `source`'s."""
    lines = [line for chunk in read_chunks(source, continued=first_line > 0) for line in chunk]
    source.seek(0)
    wanted = line_constraints([Request(x) for x in lines], constraints) or []
    for i, why in enumerate(constraint_errors(translator, lines, wanted, opts) if wanted else []):
        if why:
            raise OptionError(f"line {first_line + i + 1}: {why}", "constraints")


def _with_alternatives(found: list[Translation]) -> Translation:
    """The best translation, the next best in its `alternatives`."""
    return replace(found[0], alternatives=tuple(found[1:])) if len(found) > 1 else found[0]

"""mtkit from Python: load a model once, translate texts, streams and documents.

    import mtkit

    translator = mtkit.Translator.load("runs/multi30k/checkpoints/average.pt")
    (t,) = translator.translate(["A man is riding a bike. Two dogs play."])
    t.text, t.confidence, t.sentences  # the line, translated sentence by sentence
    mtkit.score(["Ein Mann fährt Rad."], ["Ein Mann fährt Fahrrad."]).bleu

Every result is a `mtkit.Translation` (text, score, confidence, pieces, word alignment,
sentences, alternatives); every mistake in the caller's input is an `mtkit.Error` (a
subclass per kind, each with a one-line message). The CLI's `translate` and `mtkit serve`
take the same path (`mtkit.engines.session`), so a text gets the same translation from
each of them.
"""

from __future__ import annotations

import inspect
import numbers
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, fields
from pathlib import Path

from mtkit.core.errors import OptionError, UserError
from mtkit.core.search_options import SearchOptions
from mtkit.core.terms import Glossary
from mtkit.core.textio import CHUNK_LINES, OutputFormat, lone_surrogate
from mtkit.core.translation import Translation
from mtkit.engines.base import Engine
from mtkit.engines.session import Session

Error = UserError  # the base of every error mtkit raises for its caller's input


class Translator:
    """A loaded model (a checkpoint, an ensemble of them, or an exported CTranslate2
    folder) and its decoding defaults; load it once with `Translator.load`, then
    translate as often as needed. A `Translator` holds helper processes where it
    translates several batches at once (`workers`): `close()` it, or use it in a `with`.

    Threads may share one: each call gets what it gets alone (alignments and documents
    too: what a call watches of the model is its own, `mtkit.model.attention.watching`).
    Calls run at once on a CPU with `workers` 1; what cannot be shared is taken one call
    at a time (`workers` helper processes, captured decoder steps:
    `mtkit.engines.pytorch.TorchEngine.serial`)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def load(
        cls,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        device: str = "auto",
        precision: str | None = None,
        workers: int | None = 1,
        compile: str | None = None,
    ) -> Translator:
        """The model at `path` (several paths: an ensemble). `device`: auto, cpu or
        cuda; `precision`: auto, fp32, bf16 or int8 (None: the checkpoint's);
        `workers`: batches translated at once on a CPU (1: one at a time, on all
        threads; 0: one per thread; None: the checkpoint's decode.workers); `compile`:
        auto, on or off, decoder steps compiled on a CPU (None: the checkpoint's
        decode.compile; `mtkit.tuning.compile`)."""
        from mtkit.core.device import tune_cpu_runtime
        from mtkit.core.search_options import check_compile, check_precision, check_workers
        from mtkit.engines.loader import load_engine, wants_ctranslate2

        paths = _paths(path)
        if device not in ("auto", "cpu", "cuda"):
            raise OptionError(f"device must be auto, cpu or cuda, got {device!r}", "device")
        if precision is not None:
            check_precision(precision, "precision")
        workers = _argument("workers", workers, int)
        if workers is not None:
            check_workers(workers, "workers")
        if compile is not None:
            check_compile(compile, "compile")
        if not wants_ctranslate2(paths):
            tune_cpu_runtime()
        return cls(load_engine(paths, device, "device", precision, None, workers, compile))

    @property
    def source_language(self) -> str:
        return self.engine.config.data.src_lang

    @property
    def target_language(self) -> str:
        return self.engine.config.data.tgt_lang

    def options(self, **given) -> SearchOptions:
        """The checkpoint's decoding defaults with `given` ones (None: the default)
        instead, each checked (`SearchOptions.from_config`); n_best is nbest."""
        return self._session(given).opts

    def _session(self, given: dict, **settings) -> Session:
        """A session (`Session.open`) with the search options `given` as keyword
        arguments (n_best is nbest; each checked to be of its kind, `_argument`) and
        `settings` (glossary, tgt_lang, split, batch_tokens), its errors naming the
        keywords."""
        if "n_best" in given:
            given["nbest"] = given.pop("n_best")
        known = [f.name for f in fields(SearchOptions)]
        for name in given:
            if name not in known:
                raise OptionError(
                    f"unknown option {name!r}; the options are "
                    f"{', '.join(_keyword(k) for k in known)}",
                    name,
                )
        given = {name: _argument(name, value) for name, value in given.items()}
        return Session.open(self.engine, given, spell=_keyword, target=False, **settings)

    def translate(
        self,
        texts: Iterable[str],
        *,
        beam: int | None = None,
        lenpen: float | None = None,
        n_best: int = 1,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        sampling: bool = False,
        temperature: float | None = None,
        topk: int | None = None,
        topp: float | None = None,
        seed: int | None = None,
        constraints: Sequence[Sequence[str | Sequence[str]]] | None = None,
        glossary: Glossary | None = None,
        tgt_lang: str | None = None,
        format: str = "text",
        split: bool | None = None,
        alignments: bool = False,
        align_layer: int | None = None,
        batch_tokens: int | None = None,
        ignore_tags: str | Sequence[str] | None = None,
        non_splitting_tags: str | Sequence[str] | None = None,
        splitting_tags: str | Sequence[str] | None = None,
        outline_detection: bool | None = None,
        its_rules: str | Path | None = None,
        retranslate: bool = False,
    ) -> list[Translation]:
        """One `Translation` per text, in order; `n_best` > 1 puts the next best in each
        one's `alternatives`. `constraints`: for each text, the phrases its translation
        must contain (each a phrase or a list of alternative phrases); a `glossary`
        (`mtkit.core.terms.Glossary.read`) adds its terms' wherever a text holds one.
        `tgt_lang`: the language a multilingual model translates into. `format`: text,
        or a document format's name (`mtkit.documents.formats.FORMATS`): html / xml, whose
        tags are carried through (`mtkit.documents.markup`; a text is a document or a
        fragment of one: a segment, text and elements side by side), srt subtitles, a gettext
        po catalogue, XLIFF 1.2 or 2.x (`mtkit.documents.xliff`: each untranslated unit gets
        its target). `split` (None: the checkpoint's decode.split): a text of several
        sentences is translated sentence by sentence. `alignments`: word links in each
        result, from the cross-attention of decoder layer `align_layer` (None: the last; a
        model trained with guided alignment: its trained head). For html and xml, as
        DeepL's options: `ignore_tags` (their content kept untranslated),
        `non_splitting_tags` (inline), `splitting_tags` (blocks), each names comma-separated
        or a list, `outline_detection` (False: only `splitting_tags` are blocks); and
        `its_rules`, the path of a W3C ITS 2.0 rules file (withinText and translate rules,
        above the document's own) (`mtkit.documents.elements`). `retranslate`: an XLIFF
        file's units whose target a translator filled are translated too (else kept)."""
        texts = _texts("texts", texts)
        session, format = self._open(
            dict(
                beam=beam,
                lenpen=lenpen,
                n_best=n_best,
                max_len_a=max_len_a,
                max_len_b=max_len_b,
                sampling=sampling,
                temperature=temperature,
                topk=topk,
                topp=topp,
                seed=seed,
                glossary=glossary,
                tgt_lang=tgt_lang,
                format=format,
                split=split,
                alignments=alignments,
                align_layer=align_layer,
                batch_tokens=batch_tokens,
                ignore_tags=ignore_tags,
                non_splitting_tags=non_splitting_tags,
                splitting_tags=splitting_tags,
                outline_detection=outline_detection,
                its_rules=its_rules,
                retranslate=retranslate,
            )
        )
        return session.translate_texts(texts, format, _constraints(constraints, len(texts)))

    def _open(self, options: Mapping) -> tuple[Session, str]:
        """The session `translate`'s keyword `options` (those not given: their defaults)
        open, each checked, and the format they name: once a call, whatever its texts
        (blank ones too), once for all of `translate_iter`'s."""
        glossary = options.get("glossary")
        if glossary is not None and not isinstance(glossary, Glossary):
            raise OptionError("glossary: give a Glossary (Glossary.read(path)), or None")
        format = options.get("format", "text")
        search = dict(
            (name, options.get(name))
            for name in ("beam", "lenpen", "max_len_a", "max_len_b", "temperature", "topk")
            + ("topp", "seed", "align_layer")
        )
        session = self._session(
            dict(
                search,
                n_best=options.get("n_best", 1),
                sampling=options.get("sampling") or None,
                alignments=options.get("alignments") or format != "text" or None,
            ),
            glossary=glossary,
            tgt_lang=_argument("tgt_lang", options.get("tgt_lang"), str),
            split=_argument("split", options.get("split"), bool),
            batch_tokens=_argument("batch_tokens", options.get("batch_tokens")),
            markup={
                name: options.get(name)
                for name in ("ignore_tags", "non_splitting_tags", "splitting_tags")
                + ("outline_detection", "its_rules")
            },
            retranslate=_argument("retranslate", options.get("retranslate", False), bool),
        )
        session.translate_texts([], format)  # (the format and what it allows, checked)
        return session, format

    def translate_iter(
        self, texts: Iterable[str], *, chunk: int = CHUNK_LINES, **options
    ) -> Iterator[Translation]:
        """`translate`, for a stream of texts too large to hold at once: translated
        `chunk` at a time (sorted and batched within each), yielded in order. The
        options are checked at the call, as `translate` checks them, not at the first
        text."""
        _iterable("texts", texts)
        chunk = _argument("chunk", chunk, int, low=1)
        known = [n for n in inspect.signature(self.translate).parameters if n != "texts"]
        for name in options:
            if name not in known:
                raise OptionError(
                    f"unknown option {name!r}; the options are chunk, {', '.join(known)}", name
                )
        session, format = self._open(options)
        given = options.get("constraints")
        if given is not None and not isinstance(given, (list, tuple)):
            _constraints(given, 0)  # (one line: not a list)

        def translated() -> Iterator[Translation]:
            batch: list[str] = []
            for text in texts:
                batch.append(text)
                if len(batch) == chunk:
                    yield from chunk_done(batch)
                    batch = []
            if batch:
                yield from chunk_done(batch)

        def chunk_done(batch: list[str]) -> list[Translation]:
            nonlocal given
            mine = None
            if given is not None:
                mine, given = _constraints(given[: len(batch)], len(batch)), given[len(batch) :]
            return session.translate_texts(_texts("texts", batch), format, mine)

        return translated()

    def translate_document(
        self,
        data: bytes,
        format: str,
        *,
        beam: int | None = None,
        lenpen: float | None = None,
        glossary: Glossary | None = None,
        tgt_lang: str | None = None,
        split: bool | None = None,
        batch_tokens: int | None = None,
        retranslate: bool = False,
    ) -> bytes:
        """A document file's bytes translated (`Session.translate_data`, as `mtkit
        translate -i FILE` does): an office document or an e-book (`format` docx, pptx,
        xlsx, odt, odp, epub: the same kind of file back), or a text document's (html,
        xml, srt, po, xliff: read and written in the encoding it declares). The keywords
        as `translate`'s."""
        from mtkit.documents.formats import FORMATS, listed

        if not isinstance(data, BYTES):
            raise OptionError("data: give the document's bytes (Path(...).read_bytes())", "data")
        if format not in FORMATS:
            raise OptionError(f"format must be {listed([*FORMATS])}, got {format!r}", "format")
        if glossary is not None and not isinstance(glossary, Glossary):
            raise OptionError("glossary: give a Glossary (Glossary.read(path)), or None")
        session = self._session(
            dict(beam=beam, lenpen=lenpen, alignments=True),
            glossary=glossary,
            tgt_lang=_argument("tgt_lang", tgt_lang, str),
            split=_argument("split", split, bool),
            batch_tokens=_argument("batch_tokens", batch_tokens),
            retranslate=_argument("retranslate", retranslate, bool),
        )
        return session.translate_data(bytes(data), format)

    def translate_file(
        self,
        path: str | os.PathLike,
        output: str | os.PathLike,
        *,
        format: str | None = None,
        **options,
    ) -> None:
        """The document file at `path` translated into the file `output` (written whole,
        then moved into place), in `format` (None: its suffix's: report.docx is docx);
        `options` as `translate_document`'s."""
        from mtkit.core.atomic import refuse_same_file, write_atomic
        from mtkit.documents.formats import FORMATS, output_format

        path = Path(path)
        refuse_same_file(Path(output), {"path": path})  # (the input is never written over)
        kind = output_format(format, path).kind
        if kind not in FORMATS:
            raise OptionError(
                f"{path.name}: no document format has its suffix; name one with format=",
                "format",
            )
        try:
            data = path.read_bytes()
        except OSError as e:
            raise OptionError(f"cannot read {path}: {e.strerror}") from None
        write_atomic(Path(output), self.translate_document(data, kind, **options))

    def close(self) -> None:
        """Stop the helper processes (if any); the translator stays usable."""
        self.engine.close()

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "text"}
BYTES = (bytes, bytearray, memoryview)  # encoded text, which a caller decodes first


def _argument(name: str, value, kind: type | None = None, low: int | None = None):
    """Keyword argument `name`'s `value` as a Python `kind` (bool, int, float or str;
    None: a search option's own, `OPTIONS`), or one line where it is not one or is out
    of range (below `low`; a search option: out of its own). None is every argument's
    default, and stays None. A numpy scalar is taken as the number it holds (np.int64 a
    whole number, np.float32 a number, np.bool_ True or False), never a bool as a number."""
    from mtkit.core.search_options import OPTIONS, check_value

    if value is None:
        return None
    if kind is None:  # (a search option with no default is a layer's index)
        kind = type(OPTIONS[name].default) if OPTIONS[name].default is not None else int
    # numpy's bool is no subclass of bool nor a number; named so as not to import numpy
    truth = type(value).__name__ in ("bool", "bool_")
    if kind is bool and truth:
        value = bool(value)
    elif kind is int and isinstance(value, numbers.Integral) and not truth:
        value = operator.index(value)
    elif kind is float and isinstance(value, numbers.Real) and not truth:
        value = float(value)
    elif kind is str and isinstance(value, str):
        value = str(value)
    else:
        raise OptionError(f"{_keyword(name)} must be {_KINDS[kind]}, got {value!r}", name)
    if name in OPTIONS:
        check_value(name, value, _keyword)
    elif low is not None and value < low:
        raise OptionError(f"{name} must be at least {low}, got {value!r}", name)
    return value


def _keyword(name: str) -> str:
    """How an error names an option: as the keyword argument (n_best for nbest)."""
    return "n_best" if name == "nbest" else name


def _iterable(name: str, texts, ordered: bool = True) -> None:
    """One line where argument `name` is not an iterable of texts: one text (whose
    characters would be taken for texts), a dict, what cannot be iterated, or (where
    texts are paired or answered by position: `ordered`) a set."""
    if isinstance(texts, str):
        raise OptionError(f"{name}: give a list of texts, not one text", name)
    if isinstance(texts, BYTES):
        raise OptionError(
            f"{name}: give a list of texts, not bytes (bytes are no text: decode them "
            f"first, data.decode('utf-8'))",
            name,
        )
    if (
        not isinstance(texts, Iterable)
        or isinstance(texts, Mapping)
        or (ordered and isinstance(texts, Set))
    ):
        raise OptionError(
            f"{name}: give a list of texts (or any iterable of them, in order), "
            f"got {type(texts).__name__}",
            name,
        )


def _texts(name: str, texts: Iterable[str], ordered: bool = True) -> list[str]:
    """Argument `name`'s texts (any iterable of them, read once; a set where not
    `ordered`) as a list, each checked to be text and valid Unicode."""
    _iterable(name, texts, ordered)
    texts = list(texts)
    for i, text in enumerate(texts):
        if isinstance(text, BYTES):
            raise OptionError(
                f"{name}[{i}]: expected text, got bytes (bytes are no text: decode them "
                f"first, data.decode('utf-8'))",
                name,
            )
        if not isinstance(text, str):
            raise OptionError(f"{name}[{i}]: expected text, got {type(text).__name__}", name)
        bad = lone_surrogate(text)
        if bad:
            raise OptionError(f"{name}[{i}]: {bad}", name)
    return texts


def _paths(path) -> list[str | os.PathLike]:
    """`Translator.load`'s path, or its list of paths (an ensemble), as a list."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else path
    if (
        not isinstance(paths, (list, tuple))
        or not paths
        or not all(isinstance(p, (str, os.PathLike)) for p in paths)
    ):
        raise OptionError(
            f"path: give a model's path (a str or a Path) or a list of them, got {path!r:.80}",
            "path",
        )
    return list(paths)


def _constraints(given, count: int) -> list[list[tuple[str, ...]]] | None:
    """Each text's constraints as the session takes them (`read_constraints_field`)."""
    if given is None:
        return None
    from mtkit.core.textio import read_constraints_field

    if not isinstance(given, (list, tuple)):
        raise OptionError(
            f"constraints: give one list of phrases per text, got {type(given).__name__}",
            "constraints",
        )
    if len(given) != count:
        raise OptionError(
            f"constraints: one list per text, got {len(given)} for {count} texts", "constraints"
        )
    out = []
    for i, line in enumerate(given):
        try:
            out.append(list(read_constraints_field(list(line) if type(line) is tuple else line)))
        except (ValueError, TypeError) as e:
            raise OptionError(f"constraints[{i}]: {e}", "constraints") from None
    return out


def check_file_options(written: OutputFormat, given: Mapping[str, bool]) -> None:
    """The rules of what goes with a file's format, each once, one line naming the flag:
    `given` says which of --prefix-file, --constraints (a text file's lines'), --scores and
    --alignments (text and jsonl output) were given. (--nbest with a document: the
    session's rule, `Session.translate_texts`.)"""
    for name, field in (("--prefix-file", "prefix"), ("--constraints", "constraints")):
        if given.get(name) and written.kind == "jsonl":
            raise OptionError(f'{name} is for text input; in jsonl give each line "{field}"')
        if given.get(name) and written.document:
            raise OptionError(f"{name} is for text input, not a {written.kind} document")
    for name in ("--scores", "--alignments"):
        if given.get(name) and written.document:
            raise OptionError(
                f"{name} is for text and jsonl; --format {written.kind} writes a document"
            )


def translate_file(
    engine: Engine,
    input: Path | None,
    output: Path | None,
    written: OutputFormat,
    search: Mapping[str, object],
    *,
    prefix_file: Path | None = None,
    constraints_file: Path | None = None,
    glossary_file: Path | None = None,
    tgt_lang: str | None = None,
    split: bool | None = None,
    batch_tokens: int | None = None,
    markup: Mapping[str, object] | None = None,
    retranslate: bool = False,
) -> None:
    """`mtkit translate`: the session `engine` and the command line's options open
    (`Session.open`, each error naming its flag: the `search` options, a glossary read
    from `glossary_file`), then `input` (None: stdin) translated through it to `output`
    (None: stdout; a file is replaced only once complete), with a progress bar on a
    terminal. Text and jsonl go line by line (`Session.stream`), with each line's target
    prefix and constraints (read from `prefix_file`, `constraints_file`); a document's
    format (`written.document`) reads the input as one document, or with
    `written.segments` each line as one (`_translate_segments`). `markup`: the --ignore-tags,
    --its-rules... options (`mtkit.documents.elements.MarkupRules`)."""
    from mtkit.core.terms import read_constraints
    from mtkit.core.textio import read_lines

    prefixes = read_lines(prefix_file) if prefix_file else None
    constraints = read_constraints(constraints_file) if constraints_file else None
    session = Session.open(
        engine,
        search,
        glossary=Glossary.read(glossary_file) if glossary_file else None,
        constrained_by=[
            name
            for name, path in (("--constraints", constraints_file), ("--glossary", glossary_file))
            if path
        ],
        tgt_lang=tgt_lang,
        target=written.kind != "jsonl",  # (jsonl records may name their own)
        split=split,
        batch_tokens=batch_tokens,
        markup=markup,
        retranslate=retranslate,
    )
    import sys
    from contextlib import nullcontext

    from mtkit.core.atomic import atomic_text
    from mtkit.documents.formats import check_rules

    check_rules(written.kind, session.markup)
    if "WORLD_SIZE" in os.environ:  # torchrun's (`ranks_launched` imports torch: only then)
        from mtkit.core.device import ranks_launched

        if ranks_launched():
            files = {
                "prefix": prefix_file,
                "constraints": constraints_file,
                "glossary": glossary_file,
                "its_rules": (markup or {}).get("its_rules"),
            }
            _translate_by_ranks(
                session,
                input,
                output,
                written,
                prefixes,
                constraints,
                {
                    "markup": {k: str(v) for k, v in (markup or {}).items()},
                    "files": {k: str(v) for k, v in files.items() if v},
                },
            )
            return
    if written.segments:
        from mtkit.core.progress import progress_bar

        with (
            open(input, "rb") if input else nullcontext(sys.stdin.buffer) as source,
            atomic_text(output) if output else nullcontext(sys.stdout) as sink,
            progress_bar(input) as done,
        ):
            _translate_segments(session, source, sink, written.kind, done)
        return
    if written.document:
        from mtkit.core.atomic import write_atomic

        payload = session.translate_data(
            input.read_bytes() if input else sys.stdin.buffer.read(), written.kind
        )
        if output:
            write_atomic(output, payload)
        else:
            sys.stdout.buffer.write(payload)
            sys.stdout.flush()
        return
    from mtkit.core.progress import progress_bar
    from mtkit.core.textio import read_all_lines

    with (
        open(input, "rb") if input else nullcontext(sys.stdin.buffer) as source,
        atomic_text(output) if output else nullcontext(sys.stdout) as sink,
        progress_bar(input) as done,
    ):
        # counts must agree, and every constraint fit, before anything is written
        if prefixes is not None:
            source = read_all_lines(source, len(prefixes), f"--prefix-file {prefix_file}")
        if constraints is not None:
            source = read_all_lines(source, len(constraints), f"--constraints {constraints_file}")
        session.stream(source, sink, done, prefixes, output=written, constraints=constraints)


def _translate_by_ranks(
    session: Session,
    input: Path | None,
    output: Path | None,
    written: OutputFormat,
    prefixes: list[str] | None,
    constraints: list | None,
    given: dict,
) -> None:
    """`translate_file` under torchrun: each rank translates its share of the input's
    lines into its part of the output, and rank 0 puts the parts together
    (`mtkit.engines.ranks`). A document is one process's (lines: text, jsonl, or
    --segments). `given`: the options and files (by their SHA-256) the output depends on,
    beside the session's search."""
    import io
    from dataclasses import asdict

    from mtkit.core.checksum import file_sha256
    from mtkit.engines.ranks import RanksError, translate_file_by_ranks

    if written.document and not written.segments:
        raise RanksError(
            f"a {written.kind} document is translated whole, by one process: run it "
            f"without torchrun (under torchrun: text, jsonl, or --segments)"
        )
    engine = session.engine
    options = {
        "model": getattr(engine, "digests", None) or engine.weights,
        "search": asdict(session.opts),
        "written": asdict(written),
        "session": [session.split, session.tgt_lang, session.batch_tokens, session.retranslate],
        "markup": given["markup"],
        "files": {name: file_sha256(Path(path)) for name, path in given["files"].items()},
    }

    def translate(share, source, sink, done) -> None:
        def mine(per_line: list | None) -> list | None:
            return None if per_line is None else per_line[share.first : share.end]

        if written.segments:
            _translate_segments(session, source, sink, written.kind, done, share.first)
            return
        if constraints is not None:  # (checked before a line is written: read twice)
            source = io.BytesIO(source.read())
        session.stream(
            source,
            sink,
            done,
            mine(prefixes),
            output=written,
            constraints=mine(constraints),
            first_line=share.first,
        )

    counts = {
        f"--prefix-file {given['files'].get('prefix')}": prefixes,
        f"--constraints {given['files'].get('constraints')}": constraints,
    }
    translate_file_by_ranks(
        engine,
        input,
        output,
        options,
        translate,
        {what: len(lines) for what, lines in counts.items() if lines is not None},
    )


def _translate_segments(
    session: Session, source, sink, format: str, done, first_line: int = 0
) -> None:
    """Each line of `source` translated as one document of `format` (a segment), a line
    for each in `sink`, in order, a chunk of lines in one batch (`Session.translate_texts`);
    a line that cannot be read is named in its one-line error. `first_line`: the input's
    lines before `source`'s (a rank's share, `mtkit.engines.ranks`)."""
    from mtkit.core.textio import read_chunks
    from mtkit.documents.formats import FORMATS

    count = first_line
    for lines in read_chunks(source, continued=first_line > 0):
        try:
            found = session.translate_texts(lines, format)
        except UserError as e:
            for k, line in enumerate(lines):  # which line: each read on its own
                try:
                    next(FORMATS[format].rounds(line, rules=session.markup))
                except UserError as mine:
                    raise type(mine)(f"line {count + k + 1}: {mine.line()}") from None
            raise e
        sink.write("".join(t.text + "\n" for t in found))
        sink.flush()
        count += len(lines)
        if done is not None:
            done(len(lines))


def load_config(path: str | os.PathLike | None, overrides: Iterable[str] = ()):
    """A config: the YAML at `path` (None: the defaults) with dotted `overrides`
    ("train.lr=3e-4"), checked as the commands check it (`mtkit.core.config`)."""
    from mtkit.core.config import load_config as load

    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise OptionError(
            f"path: give a config's YAML path (a str or a Path), or None (the defaults), "
            f"got {type(path).__name__}",
            "path",
        )
    return load(path, _texts("overrides", overrides), "overrides")


def _config(config, overrides: Iterable[str]):
    """A config given as one, or as its YAML's path, with `overrides` applied; one line
    naming the argument where `config` is neither (or None: the defaults) or `overrides`
    is no list of texts, before anything runs."""
    from mtkit.core.config import Config, apply_overrides, config_from_dict, config_to_dict

    overrides = _texts("overrides", overrides)
    if isinstance(config, Config):
        return config_from_dict(
            apply_overrides(config_to_dict(config), overrides, "overrides"), "overrides"
        )
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise OptionError(
            f"config: give a Config (mtkit.load_config), its YAML's path (a str or a "
            f"Path), or None (the defaults), got {type(config).__name__}",
            "config",
        )
    return load_config(config, overrides)


def train_tokenizer(config, overrides: Iterable[str] = ()) -> list[Path]:
    """`mtkit tokenizer`: the run's SentencePiece model(s); returns their paths. `config`:
    a config, or the path of its YAML."""
    from mtkit.stages.tokenizer import build_tokenizer

    return build_tokenizer(_config(config, overrides))


def preprocess(config, overrides: Iterable[str] = ()) -> dict:
    """`mtkit preprocess`: every split binarized into the run directory; returns the
    manifests."""
    from mtkit.stages.preprocess import preprocess as run_preprocess

    return run_preprocess(_config(config, overrides))


def train(config, overrides: Iterable[str] = (), resume: bool = True):
    """`mtkit train`: train (resuming where a run stopped, unless `resume` is False);
    returns how far it got and why it stopped (`mtkit.training.loop.TrainResult`)."""
    from mtkit.core.device import tune_cpu_runtime
    from mtkit.training.loop import train as run_training

    resume = _argument("resume", resume, bool)
    cfg = _config(config, overrides)
    tune_cpu_runtime()
    return run_training(cfg, resume=resume is not False)


def run(config, overrides: Iterable[str] = ()):
    """`mtkit run`: every stage, skipping finished ones; returns the final checkpoint,
    its test translations and scores (`mtkit.stages.pipeline.RunResult`)."""
    from mtkit.core.device import tune_cpu_runtime
    from mtkit.stages.pipeline import run_all

    cfg = _config(config, overrides)
    tune_cpu_runtime()
    return run_all(cfg)


@dataclass(frozen=True)
class Scores:
    """Corpus-level scores of hypotheses against references (sacreBLEU's: 13a, cased,
    detokenized), each with its signature in `signatures`."""

    bleu: float | None
    chrf: float | None
    ter: float | None
    signatures: dict[str, str]


def score(
    hypotheses: Iterable[str],
    references: Iterable[str],
    metrics: str | Iterable[str] = ("bleu", "chrf", "ter"),
) -> Scores:
    """BLEU, chrF and TER of `hypotheses` against one reference each (sacreBLEU); each
    a list or any iterable of texts. `metrics`: their names (any iterable), or one name
    ("bleu"; "bleu,chrf" as `eval --metrics`)."""
    from mtkit.core.scoring import parse_metrics
    from mtkit.core.scoring import score as corpus_score

    names = [metrics] if isinstance(metrics, str) else _texts("metrics", metrics, ordered=False)
    results = corpus_score(
        _texts("hypotheses", hypotheses),
        _texts("references", references),
        parse_metrics(",".join(names)),
    )
    by = {r.metric: r for r in results}
    return Scores(
        *(by[m].score if m in by else None for m in ("bleu", "chrf", "ter")),
        signatures={m: r.signature for m, r in by.items()},
    )

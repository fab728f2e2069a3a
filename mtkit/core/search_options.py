"""What a translation is asked for, and what a translator can do (no torch).

    OPTIONS         every decoding option once: name, default, range, help. The CLI's
                    flags, `mtkit serve`'s request fields, the config's `decode:` section
                    (`DecodeConfig`, its YAML form) and the engines all read it.
    SearchOptions   one request's search: beam or sampling, length penalty and limits,
                    n-best, no-repeat n-grams, word alignments.
    Capabilities    what an engine can honour; `check` refuses the rest in one line.

The protocol every engine follows (`Engine`) is `mtkit.engines.base`'s.

Batching (`batch_tokens`: source tokens x beam, the rows a search carries, per batch)
and output formats (`mtkit.core.textio`) are not search options: they change how lines are
grouped or written, never which translation a line gets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from mtkit.core.errors import OptionError

MAX_COUNT = 2**31 - 1  # the largest count a decoding option may hold (a C++ int's)


@dataclass(frozen=True)
class Option:
    """One decoding option. `low`/`high` bound a number (None: no bound); `above` makes
    `low` excluded; `sampling` options need sampling on."""

    name: str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    above: bool = False
    sampling: bool = False

    def problem(self, value: Any) -> str:
        """Why `value` is out of range ("must be from 1 to 256"), or ""."""
        if self.low is None or isinstance(value, bool):
            return ""
        finite = isinstance(value, int) or math.isfinite(value)  # an int of any size is
        if (
            finite
            and (value > self.low if self.above else value >= self.low)
            and (self.high is None or value <= self.high)
        ):
            return ""
        if self.above and self.high is not None:
            return f"must be in ({_number(self.low)}, {_number(self.high)}]"
        if self.above:
            return f"must be above {_number(self.low)}"
        if self.high is None:
            return f"must be at least {_number(self.low)}"
        return f"must be from {_number(self.low)} to {_number(self.high)}"


def _number(value: float) -> str:
    """A range's bound as a user reads it: 10, 2,147,483,647, 0.5."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


BEAM_MAX = 256
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("beam", 5, "Beam size (default: the checkpoint's).", 1, BEAM_MAX),
        # ((5 + length) / 6) ** lenpen must stay a float32 for any length a model can have
        Option("lenpen", 0.6, "GNMT length penalty alpha.", 0.0, 10.0),
        # A huge length limit means the model's positions: the limit is capped there.
        Option(
            "max_len_a",
            1.2,
            "Output limit a*src_len+b: a (the limit never exceeds the model's positions).",
            0,
        ),
        Option(
            "max_len_b",
            10,
            "Output limit a*src_len+b: b (the limit never exceeds the model's positions).",
            0,
        ),
        Option(
            "batch_tokens",
            8000,
            "Source tokens per batch, times the beam (the rows the search carries).",
            1,
            MAX_COUNT,
        ),
        Option("nbest", 1, "Hypotheses per line: 'i ||| text ||| score'.", 1, BEAM_MAX),
        Option(
            "no_repeat_ngram",
            0,
            "Forbid any n-gram of this size from appearing twice in an output.",
            1,
            MAX_COUNT,
        ),  # 0 (the default) is off
        Option("sampling", False, "Sample instead of searching: --beam N draws N per line."),
        Option("temperature", 1.0, "Sampling temperature.", 0, above=True, sampling=True),
        Option("topk", 0, "Sample from the k likeliest tokens.", 0, sampling=True),  # 0: all
        Option(
            "topp",
            1.0,
            "Sample from the likeliest tokens whose probability reaches p.",
            0,
            1,
            above=True,
            sampling=True,
        ),
        Option("seed", 1, "Sampling seed (per input line).", 0, sampling=True),
        Option("alignments", False, "Add word alignments (Pharaoh 'src-tgt' pairs) after a tab."),
        Option(
            "lang_vocab",
            True,
            "A multilingual model writes only pieces of the target "
            "language's training text (--no-lang-vocab: any piece).",
        ),
        Option(
            "shortlist",
            False,
            "Output only the pieces of the model's lexical shortlist for each batch's "
            "source words (a distilled student's: a smaller output layer per step).",
        ),
        Option(
            "align_layer",
            None,
            "Decoder layer whose cross-attention gives the alignments "
            "(default: the last; a model trained with guided alignment: its trained head).",
            0,
        ),
    )
}


BATCH_TOKENS = OPTIONS["batch_tokens"].default  # where a caller gives none (batching
# never changes a line's translation)


def flag(name: str) -> str:
    """An option as the command line spells it: --max-len-a."""
    return "--" + name.replace("_", "-")


def check_value(name: str, value: Any, spell: Callable[[str], str] = flag) -> None:
    """One line if `value` is out of option `name`'s range."""
    why = OPTIONS[name].problem(value)
    if why:
        raise OptionError(f"{spell(name)} {why}, got {value}", name)


@dataclass(frozen=True)
class SearchOptions:
    """How one request is searched. Defaults: `OPTIONS`."""

    beam: int = OPTIONS["beam"].default
    lenpen: float = OPTIONS["lenpen"].default
    max_len_a: float = OPTIONS["max_len_a"].default
    max_len_b: int = OPTIONS["max_len_b"].default
    nbest: int = OPTIONS["nbest"].default
    no_repeat_ngram: int = OPTIONS["no_repeat_ngram"].default
    sampling: bool = OPTIONS["sampling"].default  # draw `beam` samples per sentence
    temperature: float = OPTIONS["temperature"].default
    topk: int = OPTIONS["topk"].default
    topp: float = OPTIONS["topp"].default
    seed: int = OPTIONS["seed"].default
    alignments: bool = OPTIONS["alignments"].default
    align_layer: int | None = OPTIONS["align_layer"].default  # None: second-to-last
    lang_vocab: bool = OPTIONS["lang_vocab"].default  # `EngineBase.output_groups`
    shortlist: bool = OPTIONS["shortlist"].default  # `mtkit.search.shortlist`

    @classmethod
    def from_config(
        cls, decode: Any, spell: Callable[[str], str] = flag, **given: Any
    ) -> SearchOptions:
        """The options of `decode` (a `DecodeConfig`: beam, lenpen, max_len_a/b), with
        the `given` ones (None: not given) instead, each checked: its range, sampling
        options only with sampling, an alignment layer only with alignments, n-best
        within the beam. `spell` names an option in the error (`flag`: --nbest)."""
        given = {k: v for k, v in given.items() if v is not None}
        for name, value in given.items():
            check_value(name, value, spell)
        base = {f.name: getattr(decode, f.name) for f in fields(cls) if hasattr(decode, f.name)}
        opts = cls(**{**base, **given})
        if not opts.sampling:
            for name in (n for n, o in OPTIONS.items() if o.sampling and n in given):
                raise OptionError(
                    f"{spell(name)} is a sampling option: add {spell('sampling')}", name
                )
        if "align_layer" in given and not opts.alignments:
            raise OptionError(
                f"{spell('align_layer')} chooses where alignments come from: "
                f"add {spell('alignments')}",
                "align_layer",
            )
        if opts.nbest > opts.beam:
            beam = spell("beam") if "beam" in given else "the checkpoint's beam size"
            raise OptionError(
                f"{spell('nbest')} {opts.nbest} must not exceed {beam} {opts.beam}", "nbest"
            )
        return opts


DEFAULTS = SearchOptions()  # what a search function does where its caller says nothing


PRECISIONS = ("auto", "fp32", "bf16", "int8")  # what a PyTorch engine may translate in


def check_precision(precision: str, option: str = "--precision") -> None:
    """One line for a precision that is none of `PRECISIONS` (checked here, without
    torch, so that an exported folder's path never loads it)."""
    if precision not in PRECISIONS:
        raise OptionError(f"{option} must be auto, fp32, bf16 or int8, got {precision!r}")


CUDA_GRAPHS = ("auto", "on", "off")  # whether decoder steps run as CUDA graphs


def check_cuda_graphs(value: str, option: str = "--cuda-graphs") -> None:
    """One line for a choice of CUDA graphs that is none of `CUDA_GRAPHS` (without
    torch, as `check_precision`)."""
    if value not in CUDA_GRAPHS:
        raise OptionError(f"{option} must be auto, on or off, got {value!r}")


COMPILE = ("auto", "on", "off")  # whether decoder steps are compiled (a CPU's, Inductor)


def check_compile(value: str, option: str = "--compile") -> None:
    """One line for a choice of compiled steps that is none of `COMPILE` (without torch,
    as `check_precision`)."""
    if value not in COMPILE:
        raise OptionError(f"{option} must be auto, on or off, got {value!r}")


MAX_WORKERS = 256  # batches translated at once on a CPU (decode.workers' range)
AUTO_WORKERS = 8  # the most that auto takes: each holds a batch's activations


def cpu_workers(asked: int, threads: int) -> int:
    """Batches a CPU translates at once for decode.workers `asked` (0: auto, one per
    thread, at most `AUTO_WORKERS`), given the process's threads."""
    return asked or max(min(threads, AUTO_WORKERS), 1)


def worker_threads(workers: int, threads: int) -> int:
    """Each worker's share of `threads` when a CPU translates `workers` batches at once
    (at least one): what a helper process steps on (`mtkit.engines.workers`)."""
    return max(threads // workers, 1)


def check_workers(value: int, option: str = "--workers") -> None:
    """One line for a number of workers out of 0..MAX_WORKERS (0: auto)."""
    if not 0 <= value <= MAX_WORKERS:
        raise OptionError(f"{option} must be 0 (auto) to {MAX_WORKERS}, got {value}")


@dataclass(frozen=True)
class Capabilities:
    """What an engine honours. `needs` completes "--sampling needs ..." for the rest."""

    sampling: bool = True
    alignments: bool = True
    streaming: bool = False  # greedy lines may join a running search (`mtkit.serving`)
    constraints: bool = False  # hard lexical constraints (`mtkit.search.constraints`)
    shortlist: bool = False  # a lexical shortlist, where the model has one
    needs: str = ""


def check(
    options: SearchOptions, capabilities: Capabilities, spell: Callable[[str], str] = flag
) -> None:
    """One line for the first option that an engine with `capabilities` cannot honour."""
    for name, wanted, able in (
        ("align_layer", options.align_layer is not None, capabilities.alignments),
        ("sampling", options.sampling, capabilities.sampling),
        ("alignments", options.alignments, capabilities.alignments),
        ("shortlist", options.shortlist, capabilities.shortlist),
    ):
        if wanted and not able:
            raise OptionError(f"{spell(name)} needs {capabilities.needs}", name)


MAX_CONSTRAINTS = 62  # per line: which ones a hypothesis has met is one int64 bit mask
# (`mtkit.search.constraints`)


def constraints_need(
    options: SearchOptions, capabilities: Capabilities, spell: Callable[[str], str] = flag
) -> str:
    """What searching with constraints needs that `options` on an engine with
    `capabilities` lack ("beam search, not --sampling"), or "" where they can be
    searched for: beam search with a beam of two or more, on an engine that has it."""
    if not capabilities.constraints:
        return capabilities.needs
    if options.sampling:
        return f"beam search, not {spell('sampling')}"
    if options.beam < 2:
        return (
            f"a beam of 2 or more ({spell('beam')} {options.beam}): the beam is shared "
            f"among hypotheses that have met different numbers of constraint tokens"
        )
    return ""


def check_constraints(
    options: SearchOptions,
    capabilities: Capabilities,
    given: str = "--constraints",
    spell: Callable[[str], str] = flag,
) -> None:
    """One line where constraints (given by `given`: --constraints, --glossary, a
    request's field) cannot be searched with `options` by an engine with
    `capabilities` (`constraints_need`)."""
    need = constraints_need(options, capabilities, spell)
    if need:
        raise OptionError(f"{given} needs {need}", "constraints")

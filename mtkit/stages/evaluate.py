"""`mtkit eval`: translations scored against references with sacrebleu (BLEU, chrF, TER,
with signatures), term accuracy (--terms, --glossary), the off-target rate (--lang), and,
when the model translates the source itself (-m), how well each translation's confidence
ranks it by quality (Spearman's correlation with its sentence chrF). Everything that can
fail is checked before anything is translated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtkit.core.config import ConfigError
from mtkit.core.errors import OptionError, plural
from mtkit.core.langid import OffTarget, off_target
from mtkit.core.scoring import ConfidenceRank, Score, confidence_rank, parse_metrics, score
from mtkit.core.terms import (
    Constraint,
    Glossary,
    TermScore,
    TermsError,
    combine,
    read_constraints,
    term_accuracy,
)
from mtkit.core.textio import read_lines
from mtkit.core.translation import Translation
from mtkit.engines.base import Engine


@dataclass(frozen=True)
class EvalReport:
    """What `evaluate` found: each metric's score, and term accuracy, the off-target
    rate and the confidence's ranking where they were asked for (None otherwise)."""

    results: list[Score]
    terms: TermScore | None = None
    off_target: OffTarget | None = None
    confidence: ConfidenceRank | None = None

    def lines(self) -> list[str]:
        """The report as `eval` prints it: each metric with its signature, then the rest."""
        out = [f"{r.text}\t{r.signature}" for r in self.results]
        return out + [x.text for x in (self.terms, self.off_target, self.confidence) if x]

    def json(self) -> dict:
        """The report as `eval --json` prints it."""
        report: dict = {
            r.metric: {"score": round(r.score, 2), "signature": r.signature, "text": r.text}
            for r in self.results
        }
        if self.terms is not None:
            report["terms"] = _terms_json(self.terms)
        if self.off_target is not None:
            report["off_target"] = self.off_target.json
        if self.confidence is not None:
            report["confidence"] = {
                "spearman_chrf": round(self.confidence.spearman, 4),
                "sentences": self.confidence.sentences,
                "text": self.confidence.text,
            }
        return report


def evaluate(
    ref: Path | None,
    *,
    hyp: Path | None = None,
    model: Path | None = None,
    src: Path | None = None,
    metrics: str = "bleu,chrf,ter",
    terms: Path | None = None,
    glossary: Path | None = None,
    lang: str | None = None,
    among: str | None = None,
    tgt_lang: str | None = None,
    device: str = "auto",
    split: bool | None = None,
) -> EvalReport:
    """Score --hyp H against --ref R, or translate --src S with -m CKPT first (see the
    module's docstring); a mistake in the inputs is one `UserError`. With -m, the sources
    are translated as `mtkit translate` translates them (`split`: sentence by sentence,
    None: the checkpoint's decode.split), so the score is that of what it writes."""
    names = parse_metrics(metrics)
    _check_inputs(hyp, ref, model, src, glossary)
    among_given = _check_languages(lang, among, tgt_lang, model)
    references = read_lines(ref)
    sources = _lines_like(src, references, ref) if src is not None else None
    own, found, required = _required_terms(terms, glossary, sources, references, ref)
    engine = _engine(model, device) if model is not None else None
    # everything that can fail is checked before translating
    tag, among_used = _eval_languages(engine, lang, among_given, tgt_lang)
    translated = (
        _translated(engine, sources, tag, own, found, split) if engine is not None else None
    )
    hypotheses = (
        [t.text for t in translated]
        if translated is not None
        else _lines_like(hyp, references, ref)
    )
    return EvalReport(
        score(hypotheses, references, names),
        term_accuracy(hypotheses, required) if required is not None else None,
        off_target(hypotheses, lang, among_used) if lang else None,
        confidence_rank([t.confidence for t in translated], hypotheses, references)
        if translated is not None
        else None,
    )


def _engine(model: Path, device: str) -> Engine:
    from mtkit.core.device import tune_cpu_runtime
    from mtkit.engines.loader import load_engine, wants_ctranslate2

    if device not in ("auto", "cpu", "cuda"):
        raise OptionError(f"--device must be auto, cpu or cuda, got {device!r}")
    if not wants_ctranslate2([model]):
        tune_cpu_runtime()
    return load_engine([model], device, "--device")


def _check_inputs(
    hyp: Path | None, ref: Path | None, model: Path | None, src: Path | None, glossary: Path | None
) -> None:
    """--hyp H --ref R, or -m CKPT --src S --ref R; --glossary also needs --src."""
    if ref is None or (hyp is None) == (model is None) or (model is not None and src is None):
        raise ConfigError("give --hyp H --ref R, or -m CKPT --src S --ref R")
    if glossary is not None and src is None:
        raise OptionError("--glossary needs --src S: the source lines it finds terms in")
    if src is not None and model is None and glossary is None:
        raise OptionError("--src with --hyp is only for --glossary; to translate it, give -m")


def _check_languages(
    lang: str | None, among: str | None, tgt_lang: str | None, model: Path | None
) -> list[str]:
    """One line for a language option that would be ignored or is empty: --lang '',
    --among without codes or without --lang, --tgt-lang '' or without -m. Returns
    --among's codes ([] where not given)."""
    from mtkit.core.langid import codes

    for option, value in (("--lang", lang), ("--tgt-lang", tgt_lang)):
        if value is not None and not value.strip():
            raise OptionError(f"{option} is empty: give a language code, such as de")
    if tgt_lang is not None and model is None:
        raise OptionError("--tgt-lang is the language -m translates into: give -m, or leave it out")
    if among is None:
        return []
    if lang is None:
        raise OptionError(
            "--among is for --lang: give --lang too, the language the translations should be in"
        )
    if not codes(among):
        raise OptionError(
            f"--among {among!r} has no language codes: give them comma-separated, such as en,de"
        )
    return codes(among)


def _eval_languages(
    engine: Engine | None, lang: str | None, among: list[str], tgt_lang: str | None
):
    """Where the tag of the language `engine` (None: no -m) translates into goes
    (`languages.Tagging`: --tgt-lang's, else --lang's for a multilingual model), and the
    languages the off-target rate tells apart (--among's, else the model's); one line,
    before anything is translated, for a language the model lacks, or one py3langid
    cannot tell. --lang is py3langid's code, --tgt-lang the model's: they may differ."""
    from mtkit.core.langid import LangIdError, check_languages
    from mtkit.core.languages import Tagging, directions, tagging, target_languages

    tag, languages = Tagging(), among
    if engine is not None:
        multilingual = bool(target_languages(engine.config.data))
        option, into = (
            ("--tgt-lang", tgt_lang)
            if tgt_lang is not None
            else ("--lang", lang if multilingual else None)
        )
        try:
            tag = tagging(engine.config, into, option)
        except OptionError as e:
            hint = (
                "; give --tgt-lang for the model's code (--lang is the language-ID "
                "code the translations are checked against)"
                if option == "--lang"
                else ""
            )
            raise OptionError(f"{e}{hint}", e.option) from None
        if not among:
            languages = sorted({x for pair in directions(engine.config.data) for x in pair})
    if lang:
        try:
            check_languages(lang, languages, the_models=bool(languages) and not among)
        except LangIdError as e:
            hint = (
                f"; give --tgt-lang {lang} for the model's code, and --lang with py3langid's"
                if any(tag) and tgt_lang is None and str(e).startswith(f"--lang {lang}:")
                else ""
            )
            raise LangIdError(f"{e}{hint}") from None
    return tag, languages


def _lines_like(path: Path, references: list[str], ref: Path) -> list[str]:
    """The lines of `path`, as many as the references (or one line saying not)."""
    from mtkit.core.scoring import EvalError

    if not references:
        raise EvalError(f"nothing to score: {ref} is empty")
    lines = read_lines(path)
    if len(lines) != len(references):
        raise EvalError(
            f"line counts differ: {path} has {plural(len(lines), 'line')}, "
            f"{ref} has {len(references)}"
        )
    return lines


def _required_terms(
    terms: Path | None,
    glossary: Path | None,
    sources: list[str] | None,
    references: list[str],
    ref: Path,
) -> tuple[list[list[Constraint]] | None, Glossary | None, list[list[Constraint]] | None]:
    """The constraints of --terms (one list per line), the --glossary, and what each line
    requires of both (None: not given)."""
    own = read_constraints(terms) if terms is not None else None
    if own is not None and len(own) != len(references):
        raise TermsError(
            f"line counts differ: {terms} has {plural(len(own), 'line')}, "
            f"{ref} has {len(references)}"
        )
    found = Glossary.read(glossary) if glossary is not None else None
    per_line = ([own] if own is not None else []) + (
        [[found.constraints(line) for line in sources]] if found is not None else []
    )
    return own, found, combine(*per_line) if per_line else None


def _terms_json(accuracy: TermScore) -> dict:
    """A `TermScore` in `eval --json`: score in percent, null where no term was required."""
    score = round(100 * accuracy.accuracy, 2) if accuracy.total else None
    return {"score": score, "found": accuracy.found, "total": accuracy.total, "text": accuracy.text}


def _translated(
    engine: Engine,
    sources: list[str],
    tag,
    terms: list | None,
    glossary: Glossary | None,
    split: bool | None = None,
) -> list[Translation]:
    """`sources` translated by `engine` as `mtkit translate` translates them, through the
    same session (`mtkit.engines.session.Session`): into the language of `tag` (a
    `languages.Tagging`), with the checkpoint's decoding defaults, a line of several
    sentences split into them where `split` says (None: the checkpoint's decode.split),
    and the --terms and --glossary terms as constraints: a term of --terms that cannot be
    searched for is one line, a glossary's is left out of its line with a warning."""
    from mtkit.core.textio import Request
    from mtkit.engines.session import Session

    constrained = (terms is not None and any(terms)) or (
        glossary is not None and any(glossary.constraints(x) for x in sources)
    )  # the terms constrain the search
    session = Session.open(
        engine,
        glossary=glossary,
        constrained_by=[("--glossary" if terms is None else "--terms") + " with -m"]
        if constrained
        else [],
        target=False,  # (`tag` is checked)
        split=split,
    )
    requests = [
        Request(x, tag=tag.source, target_tag=tag.target) if x.strip() else Request(x)
        for x in sources
    ]
    found = session.translate(requests, constraints=terms)
    return [nbest[0] for nbest in found]

"""Scoring with sacrebleu: BLEU, chrF and TER on detokenized text, with signatures (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

from mtkit.core.errors import UserError, plural

METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}


class EvalError(UserError, ValueError):
    """Hypotheses and references that cannot be scored together (one line)."""


@dataclass(frozen=True)
class Score:
    metric: str  # bleu, chrf or ter
    score: float
    signature: str  # sacrebleu's reproducibility signature
    text: str  # sacrebleu's one-line summary, e.g. "BLEU = 34.12 66.0/42.1/..."


def parse_metrics(spec: str) -> list[str]:
    names = [m.strip().lower() for m in spec.split(",") if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown or not names:
        raise EvalError(
            f"unknown metric {unknown[0] if unknown else spec!r}; choose from {', '.join(METRICS)}"
        )
    return names


def score(hypotheses: list[str], references: list[str], metrics: list[str]) -> list[Score]:
    """Corpus-level scores of the hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise EvalError(
            f"{plural(len(hypotheses), 'hypothesis', 'hypotheses')} but "
            f"{plural(len(references), 'reference')}"
        )
    if not references:
        raise EvalError("nothing to score: no hypotheses and no references")
    out = []
    for name in metrics:
        metric = METRICS[name]()
        result = metric.corpus_score(hypotheses, [references])
        out.append(Score(name, float(result.score), str(metric.get_signature()), str(result)))
    return out

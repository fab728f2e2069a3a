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


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation of `x` and `y` (ties share their mean rank); 0 where
    either is constant."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else 0.0


@dataclass(frozen=True)
class ConfidenceRank:
    """How well the translations' confidences rank them by quality: Spearman's
    correlation with each sentence's chrF against its reference."""

    spearman: float
    sentences: int

    @property
    def text(self) -> str:
        return (
            f"confidence: Spearman {self.spearman:.3f} with sentence chrF "
            f"over {self.sentences} sentences"
        )


def confidence_rank(
    confidences: list[float], hypotheses: list[str], references: list[str]
) -> ConfidenceRank:
    """Spearman's correlation of `confidences` with each hypothesis' chrF (sacrebleu's
    sentence chrF against its reference), over the non-empty references."""
    chrf = CHRF()
    kept = [i for i, r in enumerate(references) if r.strip()]
    quality = [chrf.sentence_score(hypotheses[i], [references[i]]).score for i in kept]
    return ConfidenceRank(spearman([confidences[i] for i in kept], quality), len(kept))


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

"""What a search returns: a `Hypothesis`, the GNMT length penalty that scores it, and its
word alignment as text. No torch here, so that the text side of translation (and the
CTranslate2 path) can use them without loading it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # output ids, without bos / eos
    log_prob: float  # sum of the token log-probabilities, eos included
    score: float  # log_prob / length_penalty(len(tokens) + 1): what beams are ranked by
    alignment: tuple[tuple[int, int], ...] | None = None  # (source word, target word) links
    # With constraints: whether it meets them all. False: no hypothesis met them within
    # the length limit, and this is the best unconstrained one. None: none were asked.
    met: bool | None = None


def length_penalty(length, alpha: float):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016); `length` an
    int, or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def pharaoh(links: Sequence[tuple[int, int]]) -> str:
    """Links as "i-j" pairs: source word i, target word j."""
    return " ".join(f"{s}-{t}" for s, t in links)

"""Scores (`mtkit.core.scoring`): Spearman's rank correlation, and how well a confidence
ranks translations by sentence chrF."""

from __future__ import annotations

import pytest

from mtkit.core.scoring import confidence_rank, spearman


def test_spearman_on_known_rankings():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) == 0.0
    # ties share their mean rank: x ranks (0.5, 0.5, 2, 3), y ranks (0, 1, 2, 3)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)


def test_a_confidence_that_follows_quality_ranks_it():
    refs = ["ein Hund läuft", "zwei Männer reden", "eine Frau singt", ""]
    hyps = ["ein Hund läuft", "zwei Männer", "Katze", "x"]
    ranked = confidence_rank([-0.1, -0.5, -2.0, -9.0], hyps, refs)
    assert ranked.sentences == 3 and ranked.spearman == pytest.approx(1.0)
    assert confidence_rank([-2.0, -0.5, -0.1, 0.0], hyps, refs).spearman == pytest.approx(-1.0)
    assert ranked.text.startswith("confidence: Spearman 1.000")

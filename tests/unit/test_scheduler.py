"""The serve worker's join policy (`mtkit.serving.scheduler.join_policy`): when waiting
greedy requests join the running stream, and how many fit."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.serving.scheduler import JOIN_AFTER_STEPS, _Job, join_policy  # noqa: E402


def job(lines: int, longest: int = 10, seen_at_step: int = 0) -> _Job:
    return _Job(
        ["x"] * lines, SearchOptions(beam=1), lines * longest, longest, seen_at_step=seen_at_step
    )


def test_an_idle_stream_takes_the_waiting_requests_up_to_the_budget_and_always_one():
    waiting = [job(4), job(4), job(4)]
    assert join_policy(waiting, [], 0, 0, budget=80) == waiting[:2]  # 8 rows x 10 tokens
    huge = [job(100, longest=50)]
    assert join_policy(huge, [], 0, 0, budget=80) == huge  # the first always fits
    assert join_policy([], [], 0, 0, budget=80) == []


def test_a_running_stream_waits_for_enough_company_or_enough_steps():
    running = [job(10)]
    few = [job(2, seen_at_step=5)]
    assert join_policy(few, running, 10, steps=6, budget=10_000) == []  # 2 < half of 10
    assert join_policy(few, running, 10, steps=5 + JOIN_AFTER_STEPS, budget=10_000) == few
    assert join_policy(few, running, 10, steps=6, budget=10_000, eager=True) == few
    many = [job(3), job(3)]
    assert join_policy(many, running, 10, steps=0, budget=10_000) == many  # 6 >= 5


def test_the_budget_counts_the_running_sentences_and_padding():
    running = [job(6, longest=10)]
    waiting = [job(6, longest=10), job(1, longest=40)]
    # 12 rows x 10 = 120 fit; one more row at 40 wide makes 13 x 40 = 520
    assert join_policy(waiting, running, 6, steps=0, budget=200) == waiting[:1]
    assert join_policy(waiting, running, 6, steps=0, budget=520) == waiting

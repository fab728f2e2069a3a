"""The serve worker's join policy (`mtkit.serving.scheduler.join_policy`): when waiting
greedy requests join the running stream, and how many fit; and a metered `QueuedEngine`
(a document's): its sentences sent in chunks, admitted and counted by its meter."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.serving.scheduler import (  # noqa: E402
    JOIN_AFTER_STEPS,
    QueuedEngine,
    _Job,
    join_policy,
)


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


class ScriptedBatcher:
    """A batcher that answers each submitted job at once (each line's one hypothesis: the
    line itself, upper-cased) and records what it was given, in order."""

    def __init__(self, events: list):
        self.events = events

    def submit(self, lines, options, constraints, prefixes, links=None) -> Future:
        self.events.append(("submit", list(lines), prefixes, constraints))
        future: Future = Future()
        future.set_result([[line.upper()] for line in lines])
        return future


class Meter:
    """A document's meter: `chunk_lines` at a time, refusing past `max_chars`."""

    def __init__(self, events: list, chunk_lines: int, max_chars: int):
        self.events, self.chunk_lines, self.max_chars = events, chunk_lines, max_chars

    def admit(self, lines):
        self.events.append(("admit", list(lines)))
        if sum(map(len, lines)) > self.max_chars:
            raise ValueError("too large")

    def sent(self, lines):
        self.events.append(("sent", list(lines)))


def _queued(events: list) -> QueuedEngine:
    engine = SimpleNamespace(
        src_vocab=None, tgt_vocab=None, capabilities=None, config=None, steps=[1], weights=[],
        batch_tokens=100,
    )  # fmt: skip
    return QueuedEngine(engine, ScriptedBatcher(events))


def test_a_metered_engine_sends_its_lines_in_chunks_each_counted_once_back():
    events: list = []
    queued = _queued(events)
    metered = queued.metered(Meter(events, chunk_lines=2, max_chars=100))
    lines = ["a", "bb", "ccc", "d", "e"]
    prefixes = ["1", "2", "3", "4", "5"]
    options, upper = SearchOptions(beam=1), [["A"], ["BB"], ["CCC"], ["D"], ["E"]]
    assert metered.translate(lines, options, prefixes=prefixes) == upper
    assert events == [
        ("admit", lines),
        ("submit", ["a", "bb"], ["1", "2"], None),
        ("sent", ["a", "bb"]),
        ("submit", ["ccc", "d"], ["3", "4"], None),
        ("sent", ["ccc", "d"]),
        ("submit", ["e"], ["5"], None),
        ("sent", ["e"]),
    ]
    events.clear()  # the server's own engine is not metered: one job, as it came
    assert queued.translate(lines, options) == upper
    assert events == [("submit", lines, None, None)]
    assert metered.engine is queued.engine and metered.batcher is queued.batcher


def test_a_metered_engine_sends_nothing_its_meter_does_not_admit():
    events: list = []
    metered = _queued(events).metered(Meter(events, chunk_lines=2, max_chars=5))
    with pytest.raises(ValueError, match="too large"):
        metered.translate(["abc", "def"], SearchOptions(beam=1))
    assert events == [("admit", ["abc", "def"])]

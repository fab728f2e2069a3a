"""How a choice is timed: each candidate warmed up, then the fastest of runs that alternate
between the candidates, on one thread; and what a CPU measurement depends on besides its
shape (`machine_key`, the key of a choice kept in measured.json)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from mtkit.core.device import cpu_description, torch_threads

T = TypeVar("T")


def on_one_thread(measure: Callable[[], T]) -> T:
    """`measure()` on one thread: the ratio of two kernels' times is a property of a
    core, and threads that share cores with another process wait on each other."""
    with torch_threads(1):
        return measure()


def fastest_interleaved(
    measure: Callable[[Any], float], candidates: Sequence, repeats: int
) -> dict:
    """Each candidate's fastest of `repeats` runs of `measure(candidate)`, the runs
    alternating between candidates (and which goes first alternating too, so that none
    always follows another): a stretch of load from another process falls on all of
    them, and load only ever adds time, so the fastest run is the least disturbed."""
    best = {c: float("inf") for c in candidates}
    for i in range(repeats):
        for c in candidates if i % 2 == 0 else candidates[::-1]:
            best[c] = min(best[c], measure(c))
    return best


def machine_key(**shape) -> dict:
    """What a CPU measurement depends on besides its `shape`: the CPU, the vector
    instructions its kernels run (`ATEN_CPU_CAPABILITY` may hold them below the CPU's:
    bf16 measured fast on AVX-512 is slow on AVX2's kernels), torch's version and the
    threads (the key of a kept choice, `mtkit.tuning.measured`)."""
    return {
        "cpu": cpu_description(),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **shape,
    }

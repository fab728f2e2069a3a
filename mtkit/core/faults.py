"""The library's one hook point for fault tests: `fault_point(moment, **at)`.

Where a fault test must break mtkit at a precise moment that no input or signal reaches
(a translation helper killed half-way through writing a result), the code calls
`fault_point` with the moment's name and what a fault may need there. It does nothing
unless the environment variable MTKIT_FAULTS names a fault module, as `MODULE:FAULT`: the
module is imported (a test puts its folder on PYTHONPATH) and `MODULE.hook(FAULT)` gives
the function that every fault point of the process then calls with its moment and
arguments. The environment is read once per process, here only. What a fault does (kill
its process, raise, replace a file, write half a message) is the tests' own, in
tests/faults/ (`helper_faults.py`). An environment variable rather than an argument:
the processes that fail are helpers the command starts (forked or spawned), which inherit
it.

The moments, with the arguments each passes:

    helper-start    a translation helper's first act (`mtkit.engines.workers`): helper=K
                    (from 1)
    helper-loading  the helper is up, its engine not yet loaded or adopted: helper=K
    helper-taking   the helper takes a batch, holding the shared counter's lock: helper=K
    helper-sending  a helper's result framed, nothing of it written: helper=K, out (the
                    pipe's file descriptor), data (the framed bytes,
                    `mtkit.engines.helper_pipes`)
    helper-sent     that result written whole: helper=K
    rank-translated a rank of a torchrun job translated a batch of its share
                    (`mtkit.engines.ranks`): rank=R (from 0), world=N, output (the file its
                    part is beside), lines (of its share, translated so far)

Where a fault is asked (`faults_asked`), the translation pool also lets every helper load
before its own process takes a batch, so that a helper's batch moments come whatever the
machine's load.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

ENV = "MTKIT_FAULTS"


@functools.cache
def _hook() -> Callable[..., None] | None:
    """The fault module's hook for the fault MTKIT_FAULTS names, None where it names none
    (read once per process: a forked helper inherits what its parent read)."""
    named = os.environ.get(ENV, "")
    if not named:
        return None
    module, _, fault = named.partition(":")
    return importlib.import_module(module).hook(fault)


def faults_asked() -> bool:
    """Whether a test asked for a fault (MTKIT_FAULTS is set)."""
    return _hook() is not None


def fault_point(moment: str, **at: Any) -> None:
    """The named `moment` (the module's docstring lists them): nothing, unless a test
    asked for a fault, whose hook then decides what happens here."""
    hook = _hook()
    if hook is not None:
        hook(moment, **at)

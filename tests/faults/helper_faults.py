"""The faults of translation helpers (`mtkit.engines.workers`), for the fault tests
(test_fault_workers.py): the module that `mtkit.core.faults` imports in the command's
processes where MTKIT_FAULTS is `helper_faults:FAULT` (`asked` writes it, with this folder
on PYTHONPATH). FAULT makes one helper fail at one moment, the first time it comes:

    kill:MOMENT[@K]     helper K (default 1) kills itself (SIGKILL) at MOMENT:
        start           its first act, before anything is loaded or adopted
        loading         Python and torch up, its engine not yet loaded (or adopted)
        taking          on taking its first batch, holding the shared counter's lock
        before-send     its first result ready, nothing of it written
        mid-send        half of its first result's message written
        after-send      its first result written whole
    fail:loading[@K]    its load raises an error
    swap:TARGET:REPLACEMENT
                        helper 1, before it loads, replaces the file TARGET by a copy
                        of REPLACEMENT (atomically, as training does)

Imported only where a test names it: nothing here runs in a command a user starts.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mtkit.core.faults import ENV
from mtkit.engines.helper_pipes import HEADER, write

# The library's moment (`mtkit.core.faults`) at which each of kill's moments comes
KILL_MOMENTS = {
    "start": "helper-start",
    "loading": "helper-loading",
    "taking": "helper-taking",
    "before-send": "helper-sending",
    "mid-send": "helper-sending",
    "after-send": "helper-sent",
}


def asked(fault: str, env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a command whose helpers meet `fault` (the module's docstring); "": none."""
    env = {k: v for k, v in env.items() if k != ENV}
    if fault:
        here = str(Path(__file__).resolve().parent)
        paths = [here, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env.update({ENV: f"{Path(__file__).stem}:{fault}", "PYTHONPATH": os.pathsep.join(paths)})
    return env


def hook(fault: str) -> Callable[..., None]:
    """What each of the library's fault points does in this process, for `fault`."""
    head, at, which = fault.rpartition("@")
    fault, helper = (head, int(which)) if at and which.isdigit() else (fault, 1)
    action, _, rest = fault.partition(":")
    if action == "kill":
        half = rest == "mid-send"
        return _at(helper, KILL_MOMENTS[rest], lambda **at: _kill(at, half))
    if action == "fail" and rest == "loading":
        return _at(helper, "helper-loading", _fail)
    if action == "swap":
        target, replacement = rest.split(os.pathsep, 1)
        return _at(helper, "helper-loading", lambda **at: _swap(target, replacement))
    raise ValueError(f"{ENV}: no such helper fault: {fault!r}")


def _at(helper: int, moment: str, act: Callable[..., None]) -> Callable[..., None]:
    """A hook that calls `act` at `moment` of helper `helper` only, the first time."""
    done = False

    def hook(now: str, **at: Any) -> None:
        nonlocal done
        if not done and now == moment and at.get("helper") == helper:
            done = True
            act(**at)

    return hook


def _kill(at: dict[str, Any], half: bool) -> None:
    """SIGKILL this process; with `half`, first write half of the message being sent."""
    if half:
        data = at["data"]
        write(at["out"], data[: HEADER + (len(data) - HEADER) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def _fail(**_at: Any) -> None:
    raise RuntimeError(f"a load failure ({ENV})")


def _swap(target: str, replacement: str) -> None:
    shutil.copyfile(replacement, target + ".swap")
    os.replace(target + ".swap", target)

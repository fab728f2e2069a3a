"""The faults of a torchrun job's ranks (`mtkit.engines.ranks`), for the fault tests
(test_fault_ranks.py): the module that `mtkit.core.faults` imports in each rank where
MTKIT_FAULTS is `rank_faults:FAULT` (`asked` writes it, with this folder on PYTHONPATH).
FAULT names what happens at the moment "rank-translated" (a batch of a rank's share
translated):

    kill@R          rank R kills itself (SIGKILL) at its first batch, once every other
                    rank's part of the same output is finished (its record in place): a
                    rank lost half-way through its share while the others are done
    refuse@R,S...   those ranks may translate nothing (their parts must be kept): the
                    first batch they translate raises an error
    refuse@R,S...:NAME
                    the same, for the output named NAME only (a chunk of `mtkit distill`)

Imported only where a test names it: nothing here runs in a command a user starts.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mtkit.core.faults import ENV
from mtkit.engines.ranks import part_paths

WAIT_S = 300  # the longest a killed rank waits for the others' parts (a hung test's bound)


def asked(fault: str, env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a torchrun job whose ranks meet `fault` (the module's docstring)."""
    here = str(Path(__file__).resolve().parent)
    paths = [here, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, ENV: f"{Path(__file__).stem}:{fault}", "PYTHONPATH": os.pathsep.join(paths)}


def hook(fault: str) -> Callable[..., None]:
    """What the library's fault points do in this rank, for `fault`."""
    action, _, which = fault.partition("@")
    which, _, name = which.partition(":")
    chosen = {int(r) for r in which.split(",")}
    if action not in ("kill", "refuse"):
        raise ValueError(f"{ENV}: no such rank fault: {fault!r}")

    def act(moment: str, **at: Any) -> None:
        if moment != "rank-translated" or at["rank"] not in chosen:
            return
        if name and Path(at["output"]).name != name:
            return
        if action == "refuse":
            raise RuntimeError(f"rank {at['rank']} translated lines of a kept part ({ENV})")
        others = [
            part_paths(Path(at["output"]), r, at["world"])[1]
            for r in range(at["world"])
            if r not in chosen
        ]
        waited = time.monotonic() + WAIT_S
        while not all(p.exists() for p in others) and time.monotonic() < waited:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)

    return act

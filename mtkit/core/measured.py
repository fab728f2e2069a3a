"""Choices that translation measures on this machine, kept so that later processes make
the same ones.

Translation measures two things when it loads a checkpoint on a CPU: the precision
(`--precision auto`: bf16 where it is clearly faster) and the attention kernel (SDPA or
matmul + softmax). Where two timings lie near the margin, a new process could choose
the other way. The kernels round differently, so a few outputs in a thousand could change
from one run of the same command to the next. The first measurement is therefore kept,
keyed by what it depends on (the CPU, torch's version, the threads, the shape measured),
and every later process on the same machine takes it. A training run keeps its own
choices with the run (`mtkit.training`), and distillation with its corpus.

The file is `$MTKIT_CACHE_DIR/measured.json`, by default `$XDG_CACHE_HOME/mtkit` or
`~/.cache/mtkit`. `MTKIT_CACHE_DIR` set empty keeps nothing (each process measures).
Delete the file to measure again. A file that cannot be read or written counts as empty
(a debug log line): the choice is then measured, as before.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from mtkit.core.atomic import write_atomic

log = logging.getLogger(__name__)

FILE = "measured.json"


def cache_dir() -> Path | None:
    """Where measured choices are kept, or None where `MTKIT_CACHE_DIR` is set empty."""
    given = os.environ.get("MTKIT_CACHE_DIR")
    if given is not None:
        return Path(given) if given else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtkit"


def remembered(kind: str, key: dict, measure: Callable[[], dict]) -> dict:
    """The record of choice `kind` for `key` (JSON values) as first measured on this
    machine: kept from an earlier process, or `measure()`d now and kept."""
    folder = cache_dir()
    if folder is None:
        return measure()
    path = folder / FILE
    name = f"{kind} {json.dumps(key, sort_keys=True)}"
    kept = _read(path)
    if isinstance(kept.get(name), dict):
        return kept[name]
    record = measure()
    kept = _read(path)  # another process may have written meanwhile
    kept[name] = record
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(kept, indent=1, sort_keys=True).encode())
    except OSError as e:
        log.debug("measured choices not kept (%s): %s", path, e)
    return record


def _read(path: Path) -> dict:
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.debug("measured choices not read (%s): %s", path, e)
        return {}
    return kept if isinstance(kept, dict) else {}

"""Whether a translation's decoder steps are compiled on a CPU (`--compile auto|on|off`):
the choice, measured or asked for. The compiled steps themselves are
`mtkit.search.compiled`'s: a search's steps on its growing cache, compiled by Inductor
(`torch.compile`) once for symbolic sizes, into fused C++ kernels.

Inductor on a CPU writes C++ and builds it with the machine's compiler: without one
(`compiler_missing`) steps run eagerly, with one log line. Its compiled code is cached on
disk by PyTorch itself (`TORCHINDUCTOR_CACHE_DIR`, by default under /tmp; a folder in it
per vector ISA, `search.compiled.cache_per_isa`), so a later process compiles the same
step faster; Dynamo's tracing is paid again in each process.
Compiled kernels take the threads their process has when they run (a worker helper's
share), and `auto` measures them on those (`search.compiled.compiled_step_timer`).

`auto` times real decoder steps of the model (`compile_choice` with a `StepMeasure`: a
search of one full batch, eager against compiled, fastest of interleaved runs, on the
threads translation uses; the compilation itself is timed apart, reported and never
counted in the step time) and takes compiled steps where they need at most
`COMPILE_MARGIN` of eager's time. Its record is kept in measured.json
(`tuning.measured`), keyed by the CPU, the vector instructions its kernels run, torch's
version, the threads and what was measured, as `--precision auto`'s is.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

import torch

from mtkit.core.errors import first_line
from mtkit.core.search_options import check_compile
from mtkit.tuning.measured import holds_timings, remembered
from mtkit.tuning.timing import machine_key

log = logging.getLogger(__name__)

COMPILE_MARGIN = 0.9  # compiled steps are taken where they need at most 90% of eager's time
COMPILERS = ("g++", "c++", "clang++")  # what Inductor's C++ may be built with ($CXX first)

# Times real decoder steps of the model, eager and compiled:
# -> (eager seconds, compiled seconds, seconds the compilation took).
StepMeasure = Callable[[], tuple[float, float, float]]


def compiler_missing() -> str | None:
    """Why Inductor cannot build C++ kernels here (no compiler on the PATH), or None."""
    wanted = [os.environ["CXX"]] if os.environ.get("CXX") else list(COMPILERS)
    if any(shutil.which(c) for c in wanted):
        return None
    return f"no C++ compiler ({', '.join(wanted)}) on the PATH, which Inductor needs"


def compile_choice(asked: str, device: torch.device, key: dict, measure: StepMeasure) -> dict:
    """The record of `--compile`: {"compile": "on" | "off", "asked", "why"?, "eager_ms"?,
    "compiled_ms"?, "compile_s"?}. Compiled steps need a CPU and a C++ compiler:
    elsewhere steps run eagerly and the record says why (one log line: a warning where
    asked on, else a debug line, as `--precision auto` keeps stderr for errors). `on`
    takes them unmeasured; `auto` keeps in measured.json, under `key` (what was
    measured: the model's shape, the precision, the attention kernel, the batch), the
    first measurement on this machine (`measure`, `decide`)."""
    check_compile(asked, "compile")
    if asked == "off":
        return {"compile": "off", "asked": asked}
    why = (
        f"compiled steps run on a CPU (on {device.type}, see --cuda-graphs)"
        if device.type != "cpu"
        else compiler_missing()
    )
    if why is not None:
        log.log(
            logging.WARNING if asked == "on" else logging.DEBUG,
            "--compile %s: decoder steps run eagerly: %s",
            asked,
            why,
        )
        return {"compile": "off", "asked": asked, "why": why}
    if asked == "on":
        return {"compile": "on", "asked": asked}
    return remembered(
        "translation compile", machine_key(**key), lambda: decide(measure), _usable_compile
    )


def decide(measure: StepMeasure) -> dict:
    """`auto`'s record from one measurement: compiled where a step needs at most
    `COMPILE_MARGIN` of an eager one; eager, with one warning, where compiling fails."""
    try:
        eager, compiled, compiling = measure()
    except Exception as e:  # noqa: BLE001 - any failure to compile means: eager steps
        log.warning(
            "--compile auto: compiling a decoder step failed (%s); eager steps", first_line(e)
        )
        return {"compile": "off", "asked": "auto", "why": first_line(e)}
    chosen = "on" if compiled <= COMPILE_MARGIN * eager else "off"
    log.debug(  # translation keeps stderr for errors, as precision's auto (shown with -v)
        "--compile auto: a decoder step took %.2f ms eagerly and %.2f ms compiled (compiling "
        "took %.1f s): %s",
        eager * 1e3,
        compiled * 1e3,
        compiling,
        "compiled steps" if chosen == "on" else "eager steps",
    )
    return {
        "compile": chosen,
        "asked": "auto",
        "eager_ms": round(eager * 1e3, 3),
        "compiled_ms": round(compiled * 1e3, 3),
        "compile_s": round(compiling, 2),
    }


def _usable_compile(record: dict) -> bool:
    """Whether a kept record of `--compile auto`'s choice is one this mtkit makes
    (`decide`): on or off, asked as auto, with timings where it has them."""
    return (
        record.get("compile") in ("on", "off")
        and record.get("asked") == "auto"
        and holds_timings(record, ("eager_ms", "compiled_ms", "compile_s"))
    )

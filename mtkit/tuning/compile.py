"""Compiled decoder steps on a CPU: a search's fixed-shape step (`mtkit.search.captured`)
compiled by Inductor (`torch.compile`) into fused C++ kernels, and the choice, measured or
asked for, of whether a translation's steps are compiled (`--compile auto|on|off`).

A compiled step is a capture (`tuning.capture.Capture`) like a CUDA graph: the
`CapturedDecoder` gives it a step on tensors of its own, one per shape it meets, and
replays it; here the recording is Inductor's compilation of that step (`inductor_capture`),
for the shape's static sizes, and a replay runs the compiled code. Shapes are bounded as
for graphs: a batch's cache is preallocated in capacities of `cache.CAPACITY_STEP`
positions and rows leave only at halves (a batch of B sentences: about log2(B) shapes),
and at most `captured.MAX_SLOTS` slots are kept. Compiled code is kept by Dynamo for the
process, shared by slots of one shape: at most `COMPILED_SHAPES` shapes are compiled in
a process; a shape beyond them runs eagerly (in fixed shapes), with one log line. Batches
are not bucketed further: each batch's sentences and source width make its own shapes,
so a long input of varied lengths meets more shapes than are compiled.

Inductor on a CPU writes C++ and builds it with the machine's compiler: without one
(`compiler_missing`) steps run eagerly, with one log line. Its compiled code is cached on
disk by PyTorch itself (`TORCHINDUCTOR_CACHE_DIR`, by default under /tmp), so a later
process compiles the same step faster; Dynamo's tracing is paid again in each process.

`auto` times real decoder steps of the model (`compile_choice` with a `StepMeasure`: a
search of one full batch, eager against compiled, fastest of interleaved runs, on one
thread; the compilation itself is timed apart, reported and never counted in the step
time) and takes compiled steps where they need at most `COMPILE_MARGIN` of eager's time.
Its record is kept in measured.json (`tuning.measured`), keyed by the CPU, torch's
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
from mtkit.model.attention import watched
from mtkit.tuning.measured import holds_timings, remembered
from mtkit.tuning.timing import machine_key

log = logging.getLogger(__name__)

COMPILE_MARGIN = 0.9  # compiled steps are taken where they need at most 90% of eager's time
COMPILED_SHAPES = 16  # step shapes compiled in a process, at most (`captured.MAX_SLOTS`)
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


def inductor_capture(work: Callable[[], None]) -> Callable[[], None]:
    """`work` (a step on tensors of its own) compiled by Inductor for its static shapes,
    and run once, so that compiling happens, and fails, here (`CapturedDecoder` then runs
    that shape eagerly, as it does past `COMPILED_SHAPES` shapes in this process);
    returns what runs the compiled code. While an attention is
    watched (`mtkit.model.attention.watching`: alignments, `mtkit explain`), the step runs
    eagerly, so that its observers see it."""
    with torch._dynamo.config.patch(  # the step's code, compiled once per shape
        recompile_limit=COMPILED_SHAPES, fail_on_recompile_limit_hit=True
    ):
        compiled = torch.compile(work, dynamic=False)
        try:
            compiled()
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            raise RuntimeError(
                f"{COMPILED_SHAPES} step shapes are compiled in this process, the most"
            ) from None

    def replay() -> None:
        (work if watched() else compiled)()

    return replay


def compile_choice(
    asked: str, device: torch.device, key: dict, measure: StepMeasure, workers: int = 1
) -> dict:
    """The record of `--compile`: {"compile": "on" | "off", "asked", "why"?, "eager_ms"?,
    "compiled_ms"?, "compile_s"?}. Compiled steps need a CPU, a C++ compiler and batches
    translated in this process (`workers` 1; helper processes step eagerly): elsewhere
    steps run eagerly and the record says why (one log line: a warning where asked on,
    else a debug line, as `--precision auto` keeps stderr for errors). `on` takes them
    unmeasured; `auto` keeps in measured.json, under `key` (what was measured: the
    model's shape, the precision, the attention kernel), the first measurement on this machine
    (`measure`, `decide`)."""
    check_compile(asked, "compile")
    if asked == "off":
        return {"compile": "off", "asked": asked}
    why = (
        f"compiled steps run on a CPU (on {device.type}, see --cuda-graphs)"
        if device.type != "cpu"
        else f"--workers {workers}: batches run in helper processes, which step eagerly"
        if workers > 1
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

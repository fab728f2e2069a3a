"""Which shapes a run's batches take, measured as `precision: auto` is.

Where oneDNN compiles a bf16 kernel for each matrix shape it meets (AMX), compiling costs
far more than computing; token-bucketed batches bring hundreds of
shapes an epoch, more than its kernel caches hold. Where `train.batch_shapes: auto`
measures a new shape at `NEW_SHAPE_COST` times a known one or more, in the bf16 the run
chose, the run trains on batches of few shapes (`data.batching.BatchShapes`): more padded
positions, more tokens/s. In fp32 on a CPU nothing is
compiled per shape, and the batches stay token-bucketed. On CUDA the run's attention
(the kernel chosen) is timed at a new shape and a known one instead
(`attention.time_kernel_shapes`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import torch

from mtkit.core.errors import first_line
from mtkit.tuning.attention import AttentionShape, device_attention_timer, time_kernel_shapes
from mtkit.tuning.precision import linear_timer

log = logging.getLogger(__name__)

NEW_SHAPE_COST = 2.0  # batches of few shapes where a new shape costs 2x a known one or more


# One timed forward+backward of a Linear at a number of rows -> seconds (the first call at
# a number of rows it has not seen pays for that shape's kernels).
ShapeMeasure = Callable[[int], float]

# Row counts that timing new shapes has used in this process (a shape is new only once).
_fresh_rows = itertools.count(1)


def time_shapes(
    measure: ShapeMeasure, rows: int, fresh_above: int, repeats: int = 3
) -> tuple[float, float]:
    """(seconds at a new shape, seconds at the same shape once known): after two warm-up
    calls at `rows`, `repeats` times a first call at a number of rows never timed before
    in this process and above `fresh_above` (so above any a training batch has, whose
    kernels could still be cached), then two more calls at it; each side's fastest (load
    only adds time)."""
    measure(rows)
    measure(rows)
    new = known = float("inf")
    for _ in range(repeats):
        fresh = max(rows, fresh_above) + next(_fresh_rows)
        new = min(new, measure(fresh))
        known = min(known, measure(fresh), measure(fresh))  # (the 2nd call still settles)
    return new, known


def choose_batch_shapes(
    asked: str,
    device: torch.device,
    dtype: torch.dtype | None,
    shape: tuple[int, int, int],
    fresh_above: int = 0,
    measure: ShapeMeasure | None = None,
    attention: tuple[str, AttentionShape] | None = None,
) -> dict:
    """The batch-shape record of a run: {"shapes": "exact" | "classes", "asked",
    "new_shape_ms"?, "known_shape_ms"?}. `auto` measures on a CPU in bf16 (on one thread,
    as the precision calibration), timing forward+backward of the Linear `shape` =
    (rows, d_in, d_out) at new row counts above `fresh_above` (the run's max_tokens),
    first and once known; in fp32 on a CPU it keeps token batches. On CUDA it times the
    run's `attention` (kernel, shape) at a new length and a known one. `measure`
    replaces the real timer (on CUDA too)."""
    if asked != "auto":
        return {"shapes": asked, "asked": asked}
    on_gpu = device.type == "cuda"
    if not on_gpu and dtype is None:
        return {"shapes": "exact", "asked": asked}
    rows, d_in, d_out = shape
    if measure is not None:
        new, known = time_shapes(measure, rows, fresh_above)
    elif on_gpu:
        if attention is None:
            raise ValueError("choose_batch_shapes on CUDA needs the run's attention")
        kernel, attention_shape = attention
        timer = device_attention_timer(attention_shape, dtype, device)
        try:
            timing = time_kernel_shapes(timer, (kernel,))[kernel]
        except RuntimeError as e:  # (as `choose_device_attention`): token batches, as before
            log.warning("batch shapes auto: measuring on %s failed (%s); token batches", device, e)
            return {"shapes": "exact", "asked": asked, "failed": first_line(e)}
        new, known = timing.new_s, timing.known_s
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            new, known = time_shapes(
                lambda n: linear_timer(n, d_in, d_out)(dtype, n), rows, fresh_above
            )
        finally:
            torch.set_num_threads(threads)
    chosen = "classes" if new >= NEW_SHAPE_COST * known else "exact"
    timed = (
        f"the run's attention ({attention[0] if attention else 'measured'})"
        if on_gpu
        else f"a ({max(rows, fresh_above)}+ x {d_in}) x ({d_in} x {d_out}) Linear"
    )
    log.info(
        "batch shapes auto: %s, forward+backward in %s, took %.2f ms at a new shape and "
        "%.2f ms at a known one on this %s: %s",
        timed,
        "bf16" if dtype is not None else "fp32",
        new * 1e3,
        known * 1e3,
        "GPU" if on_gpu else "CPU",
        "batches in few shapes" if chosen == "classes" else "token batches",
    )
    return {
        "shapes": chosen,
        "asked": asked,
        "new_shape_ms": round(new * 1e3, 3),
        "known_shape_ms": round(known * 1e3, 3),
    }

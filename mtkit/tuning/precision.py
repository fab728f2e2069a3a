"""The precision a run trains in and a translation runs in, measured where it depends on
the hardware.

CPUs differ: with AMX, bf16 matrix products run several times fp32; with AVX512-BF16
alone faster on some machines, slower on others. So `precision: auto`
on a CPU does not guess from CPU flags: it times a forward and backward pass of one
Linear layer of the model's own shapes in fp32 and in bf16 (`calibrate_cpu`: warmed up,
interleaved, on one thread) and takes bf16 only when it is clearly faster.
On CUDA, `auto` is bf16 where supported. Training decides once per run and stores the
choice (`mtkit.tuning.run`); translation's `auto` times forward only, in bf16 weights,
and keeps its choice in measured.json (`inference_precision`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mtkit.core.config import Config
from mtkit.core.device import autocast
from mtkit.core.errors import OptionError
from mtkit.core.search_options import check_precision
from mtkit.model import int8
from mtkit.tuning.measured import holds_timings, remembered
from mtkit.tuning.timing import fastest_interleaved, machine_key, on_one_thread

log = logging.getLogger(__name__)

BF16_MARGIN = 0.9  # bf16 is taken when it needs at most 90% of the fp32 time


@dataclass(frozen=True)
class Calibration:
    """Seconds per forward+backward of one Linear layer, in fp32 and in bf16: the fastest
    of interleaved runs of each."""

    fp32_s: float
    bf16_s: float

    @property
    def bf16_faster(self) -> bool:
        return self.bf16_s <= BF16_MARGIN * self.fp32_s

    def as_dict(self) -> dict:
        return {"fp32_ms": round(self.fp32_s * 1e3, 3), "bf16_ms": round(self.bf16_s * 1e3, 3)}


# One timed forward+backward: (autocast dtype or None for fp32, rows) -> seconds.
Measure = Callable[[torch.dtype | None, int], float]


def linear_timer(rows: int, d_in: int, d_out: int, backward: bool = True) -> Measure:
    """A `Measure` of Linear(d_in, d_out) on up to `rows` inputs: forward+backward under
    autocast, as training runs it, or (`backward` False) forward only with the weights
    and inputs in the dtype itself, as translation on a CPU runs it (`bf16_weights` in
    `mtkit.engines.pytorch_precision`)."""
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(d_in, d_out)
    x = torch.randn(rows, d_in, generator=generator)
    if not backward:
        bf16_layer = copy.deepcopy(layer).to(torch.bfloat16)
        bf16_x = x.to(torch.bfloat16)

    def once(dtype: torch.dtype | None, n: int) -> float:
        if not backward:
            inputs, linear = (x[:n], layer) if dtype is None else (bf16_x[:n], bf16_layer)
            start = time.perf_counter()
            with torch.no_grad():
                linear(inputs)
            return time.perf_counter() - start
        inputs = x[:n].clone().requires_grad_(backward)
        start = time.perf_counter()
        with autocast("cpu", dtype):
            y = layer(inputs)
        y.float().sum().backward()
        layer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    return once


def calibrate_cpu(
    rows: int,
    d_in: int,
    d_out: int,
    repeats: int = 9,
    measure: Measure | None = None,
    backward: bool = True,
) -> Calibration:
    """Time Linear(d_in, d_out) on (rows, d_in) inputs in fp32 and in bf16
    (`linear_timer`: forward+backward under autocast, or forward only in bf16 weights),
    robustly enough that a busy machine makes the same choice as an idle one:

    - every candidate is warmed up before it is timed (the first bf16 call pays for
      kernel selection and JIT: timing it once made bf16 look much slower than it was);
    - fp32 and bf16 runs alternate, so a stretch of load from another process falls on
      both, and each side's figure is its fastest run: load only ever adds time, so the
      fastest of several runs is the one least disturbed (a median still moves when
      most runs are slowed, as on a machine that another training keeps busy);
    - bf16 is first probed on 1/16 of the rows (warmed up, fastest of three): without
      bf16 instructions it runs far slower than fp32, and a hopeless probe ends the
      calibration at once, so that it stays well under a second there too;
    - it runs on one thread: the ratio of the two precisions is a property of a core,
      and a parallel region whose threads share cores with another process waits for
      the slowest of them (spikes).

    `measure` replaces the real timer (tests fake the timings)."""
    if measure is None:  # the real timer, on one thread
        return on_one_thread(
            lambda: calibrate_cpu(
                rows, d_in, d_out, repeats, linear_timer(rows, d_in, d_out, backward)
            )
        )
    once = measure
    bf16 = torch.bfloat16
    probe_rows = max(1, rows // 16)
    once(None, rows)
    once(bf16, probe_rows)
    fp32_quick = min(once(None, rows) for _ in range(3))
    probe = min(once(bf16, probe_rows) for _ in range(3)) * rows / probe_rows
    if probe > 10 * fp32_quick:
        return Calibration(fp32_s=fp32_quick, bf16_s=probe)
    once(bf16, rows)
    best = fastest_interleaved(lambda dtype: once(dtype, rows), (None, bf16), repeats)
    return Calibration(fp32_s=min(best[None], fp32_quick), bf16_s=best[bf16])


def calibration_shape(max_tokens: int, d_model: int, ffn_dim: int) -> tuple[int, int, int]:
    """(rows, d_in, d_out) of the Linear timed for `auto`: the model's first FFN layer on
    up to `max_tokens` rows, fewer for bigger models so that one forward+backward stays
    near 1 GFLOP."""
    rows = max(64, min(max_tokens, 1_000_000_000 // (6 * d_model * ffn_dim)))
    return rows, d_model, ffn_dim


def inference_shape(batch_tokens: int, d_model: int, ffn_dim: int) -> tuple[int, int, int]:
    """(rows, d_in, d_out) of the Linear timed for translation's `auto`: the first FFN
    layer at one step of a full batch (about `batch_tokens` / 16 rows: sentences of ~16
    tokens times the beam), at least 64 rows."""
    return max(64, batch_tokens // 16), d_model, ffn_dim


def precision_record(
    dtype: torch.dtype | None, asked: str, calibration: Calibration | None
) -> dict:
    """What a choice of precision is stored or shown as: {"precision": "fp32" | "bf16",
    "asked", "calibration"? (when measured)}."""
    record = {"precision": "bf16" if dtype is not None else "fp32", "asked": asked}
    if calibration is not None:
        record["calibration"] = calibration.as_dict()
    return record


def resolve_precision(
    precision: str,
    device: torch.device,
    shape: tuple[int, int, int] | None = None,
    backward: bool = True,
) -> tuple[torch.dtype | None, Calibration | None]:
    """The autocast dtype (None for plain fp32) and, when `auto` measured it on the CPU,
    the calibration behind the choice. `shape` = (rows, d_in, d_out) of the Linear layer
    to time, forward+backward for training or forward only (`backward` False) for
    translation; without it `auto` keeps fp32 on a CPU."""
    if precision == "bf16":
        return torch.bfloat16, None
    if precision == "fp32":
        return None, None
    if device.type == "cuda":
        return (torch.bfloat16 if torch.cuda.is_bf16_supported() else None), None
    if shape is None:
        return None, None
    calibration = calibrate_cpu(*shape, backward=backward)
    chosen = "bf16" if calibration.bf16_faster else "fp32"
    # Training shows its measurement; translation keeps stderr for errors (an error's one
    # line must be the only one) and shows it with -v.
    log.log(
        logging.INFO if backward else logging.DEBUG,
        "precision auto: a (%d x %d) x (%d x %d) Linear, %s, took %.2f ms in fp32 and "
        "%.2f ms in bf16 on this CPU: %s",
        shape[0],
        shape[1],
        shape[1],
        shape[2],
        "forward+backward" if backward else "forward",
        calibration.fp32_s * 1e3,
        calibration.bf16_s * 1e3,
        chosen,
    )
    return (torch.bfloat16 if calibration.bf16_faster else None), calibration


def inference_precision(
    asked: str, device: torch.device, cfg: Config
) -> tuple[torch.dtype | None, dict]:
    """The dtype translation runs in (None: fp32; bf16: autocast on CUDA, the models'
    weights on a CPU, `bf16_weights`) and its record. `auto` takes bf16 on CUDA; on a CPU
    it times the model's first FFN layer at one decoding step of a full batch, forward
    only, with bf16 weights and inputs, and takes bf16 only where it needs at most 90% of
    fp32's time (AVX512-BF16, AMX; never where bf16 is emulated). int8 (`mtkit.model.int8`) is taken
    only when asked, on a CPU: it rounds every product, so it changes more outputs; its
    record has the weight range `int8.weight_range()` found exact on this CPU."""
    check_precision(asked)
    if asked == "int8":
        if device.type != "cpu":
            raise OptionError("--precision int8 runs on a CPU; on CUDA use bf16 (or auto)")
        if not int8.int8_supported():
            raise OptionError(
                f"--precision int8 needs int8 matrix products on a CPU, which "
                f"this torch ({torch.__version__}) lacks; use fp32 or auto"
            )
        weights = int8.weight_range()
        if weights < int8.QMAX:
            log.info(
                "precision int8: full-range int8 products are not exact on this CPU "
                "(no VNNI instructions): weights are rounded to -%d..%d",
                weights,
                weights,
            )
        return None, {"precision": "int8", "asked": asked, "int8_weight_range": weights}
    shape = inference_shape(cfg.decode.batch_tokens, cfg.model.d_model, cfg.model.ffn_dim)

    def measured() -> dict:
        dtype, calibration = resolve_precision(asked, device, shape, backward=False)
        return precision_record(dtype, asked, calibration)

    if asked != "auto" or device.type != "cpu":
        record = measured()  # nothing measured
    else:  # measured once on this machine, then the same every time (`tuning.measured`)
        record = remembered(
            "translation precision", machine_key(shape=list(shape)), measured, _usable_precision
        )
    return (torch.bfloat16 if record["precision"] == "bf16" else None), record


def _usable_precision(record: dict) -> bool:
    """Whether a kept record of `--precision auto`'s choice on a CPU is one this mtkit
    makes (`precision_record`): fp32 or bf16 (never int8, which only a user asks for),
    asked as auto, with the calibration's timings where it has them."""
    calibration = record.get("calibration", {})
    return (
        record.get("precision") in ("fp32", "bf16")
        and record.get("asked") == "auto"
        and isinstance(calibration, dict)
        and holds_timings(calibration, ("fp32_ms", "bf16_ms"))
    )

"""Device and precision policy, measured where it depends on the hardware; the
process-wide CPU runtime settings, applied once by the CLI.

CPUs differ: with AMX, bf16 matrix products run several times fp32; with AVX512-BF16
alone they ran 2.6-3.5x fp32 on some machines and 0.64x on another. So `precision: auto`
on a CPU does not guess from CPU flags: it times a forward and backward pass of one
Linear layer of the model's own shapes in fp32 and in bf16 (`calibrate_cpu`: warmed up,
interleaved, on one thread, about 0.2 s) and takes bf16 only when it is clearly faster.
On CUDA, `auto` is bf16 where supported. Training decides once per run and stores the
choice (`mtkit.training.state.decided_once`).
"""

from __future__ import annotations

import copy
import ctypes
import gc
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from mtkit.core.errors import UserError

log = logging.getLogger(__name__)

T = TypeVar("T")

BF16_MARGIN = 0.9  # bf16 is taken when it needs at most 90% of the fp32 time

# bf16 matrix products on a CPU run through oneDNN, which compiles a kernel for every
# matrix shape and keeps it, about 1-4 MB each, in two caches of 1,024 entries (its own
# primitive cache and PyTorch's ideep LRU cache; both read their size from the
# environment at their first use). Token-bucketed batches bring a hundred new shapes an
# epoch, so bf16 training of configs/multi30k.yaml grew to 2.9 GB against 1.2 GB in fp32.
# With 32 entries it stays at 1.27 GB, at the same speed (5,731 against 5,412 tok/s, one
# run each on a 2-core AVX512-BF16 EPYC): the caches could not hold an epoch's kernels
# anyway, so the shapes they dropped were compiled again at either size.
ONEDNN_CACHE_ENTRIES = 32


class DeviceError(UserError, ValueError):
    """A device that was asked for and is not there (one line naming the option)."""


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """`auto` -> CUDA when present, else CPU. Asking for CUDA without one is an error
    whose message names `option` the way the user gave it (`--device` or `train.device`)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            sep = " " if option.startswith("--") else "="
            raise DeviceError(
                f"{option}{sep}cuda, but no CUDA device is available (use {option}{sep}auto or cpu)"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> AbstractContextManager:
    """The precision a pass runs in: autocast to `dtype` (bf16) on `device` (CUDA, or a
    CPU where `precision` chose bf16), or none, plain fp32, when `dtype` is None."""
    kind = device.type if isinstance(device, torch.device) else device
    return torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None)


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


def cuda_graph(work: Callable[[], None], warmup: int) -> Callable[[], None]:
    """`work` recorded as a CUDA graph, after `warmup` runs of it on a side stream (as
    CUDA graphs want: lazy initialisations, kernels chosen); returns the graph's replay,
    which runs the recorded kernels on the tensors `work` used. What `work` sets aside
    (its outputs) during the capture is where each replay writes.

    Autocast's cache of cast weights is off meanwhile (its dtype and whether it is on
    are kept): the graph must record the casts itself, not read copies that autocast
    frees when its region ends (a validation's copies, made for its loss, go with each
    batch, and the weights change between validations). Only this thread's calls are
    checked while recording (`thread_local`): a training's data loader may use CUDA in
    another thread meanwhile (pinned memory)."""
    own_casts = torch.autocast(
        "cuda",
        dtype=torch.get_autocast_dtype("cuda"),
        enabled=torch.is_autocast_enabled("cuda"),
        cache_enabled=False,
    )
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with own_casts:
        with torch.cuda.stream(side):
            for _ in range(warmup):
                work()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            work()
    return graph.replay


def linear_timer(rows: int, d_in: int, d_out: int, backward: bool = True) -> Measure:
    """A `Measure` of Linear(d_in, d_out) on up to `rows` inputs: forward+backward under
    autocast, as training runs it, or (`backward` False) forward only with the weights
    and inputs in the dtype itself, as translation on a CPU runs it (`bf16_weights` in
    `mtkit.engines.pytorch`)."""
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
      kernel selection and JIT: timing it once made bf16 look 70x slower than it was);
    - fp32 and bf16 runs alternate, so a stretch of load from another process falls on
      both, and each side's figure is its fastest run: load only ever adds time, so the
      fastest of several runs is the one least disturbed (a median still moves when
      most runs are slowed, as on a machine that another training keeps busy);
    - bf16 is first probed on 1/16 of the rows (warmed up, fastest of three): without
      bf16 instructions it runs 40x slower than fp32, and a hopeless probe ends the
      calibration at once, so that it stays well under a second there too;
    - it runs on one thread: the ratio of the two precisions is a property of a core,
      and a parallel region whose threads share cores with another process waits for
      the slowest of them (16x spikes with two threads on a busy 2-core machine).

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


def on_one_thread(measure: Callable[[], T]) -> T:
    """`measure()` on one thread: the ratio of two kernels' times is a property of a
    core, and threads that share cores with another process wait on each other."""
    with torch_threads(1):
        return measure()


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Within: torch's threads set to `count`; after: as they were."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    """What a CPU measurement depends on besides its `shape`: the CPU, torch's version
    and the threads (the key of a kept choice, `mtkit.core.measured`)."""
    return {
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **shape,
    }


def cpu_description() -> str:
    """The CPU's model name and the flags that decide bf16 speed (AVX-512, AVX512-BF16,
    AMX), e.g. "AMD EPYC (avx512f avx512_bf16)": stored with a run's precision choice
    and printed beside every benchmark figure."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        return platform.processor() or model
    shown = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({' '.join(shown) or 'no avx512'})"


def calibration_shape(max_tokens: int, d_model: int, ffn_dim: int) -> tuple[int, int, int]:
    """(rows, d_in, d_out) of the Linear timed for `auto`: the model's first FFN layer on
    up to `max_tokens` rows, fewer for bigger models so that one forward+backward stays
    near 1 GFLOP (about 8 ms at 130 GFLOP/s)."""
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


def release_freed_memory() -> None:
    """Hand the heap's freed pages back to the OS (glibc's `malloc_trim`): after
    training, so that `mtkit run` translates in the memory translation needs, not in
    what training left free (`tune_cpu_runtime` tells glibc to keep freed blocks)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError) as e:
        log.debug("malloc_trim unavailable (%s)", e)


def tune_cpu_runtime() -> None:
    """Three process-wide settings that make CPU training faster or leaner; the CLI
    applies them once per process, before the first matrix product (library calls leave
    the process as it was).

    Flush denormal floats to zero: the exponentials of the loss's backward pass slowed
    10x on denormal inputs. Make glibc keep large freed blocks instead of returning
    them to the OS: by default every allocation over 32 MB (logits, their gradient) gets
    fresh pages from the kernel, and the page faults cost more than the arithmetic on
    them (1.3x faster training of the Multi30k model on 2 cores); skipped where the C
    library is not glibc. And keep oneDNN's kernel caches small (`ONEDNN_CACHE_ENTRIES`)."""
    torch.set_flush_denormal(True)
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(ONEDNN_CACHE_ENTRIES))  # a user's own value wins
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, 1 << 31)
    except (OSError, AttributeError) as e:
        log.debug("mallopt unavailable (%s); using the allocator's defaults", e)

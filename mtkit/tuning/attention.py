"""Which attention kernel a run trains with, measured as `precision: auto` is.

`scaled_dot_product_attention` and explicit matmul + softmax (`attention.matmul_attention`)
compute the same function, but not at the same speed everywhere: on some CPUs the matmul
form trains faster in bf16 and no faster in fp32. So `train.attention: auto` times
forward+backward of both at the run's own shapes (its batch of `max_tokens` tokens, its
sentences' mean length, its heads), in the precision the run chose, and keeps the matmul
form only where it is clearly faster. The choice is made once, at the run's first start, and
stored in every checkpoint with the precision (`mtkit.tuning.run`): a resumed run reuses it.

On CUDA the time of a new shape counts too. SDPA there may take cuDNN's attention, which
builds a plan for every new shape: a first epoch of token-bucketed batches, nearly all new
shapes, is many times slower than the next ones. So `auto` times each kernel's first call at
a new shape beside its calls at a known one (`time_kernel_shapes`), and takes only a kernel
whose new shapes cost at most `STABLE_SHAPE_COST` times a known one, where one is.

Translation's kernel is measured too, forward only at one beam-search step
(`choose_decoding_attention`), and kept in measured.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtkit.core.config import Config
from mtkit.core.device import autocast
from mtkit.core.errors import first_line
from mtkit.model.attention import ATTENTION_KERNELS, matmul_attention
from mtkit.tuning.measured import holds_timings, remembered
from mtkit.tuning.precision import inference_shape
from mtkit.tuning.timing import fastest_interleaved, machine_key, on_one_thread

log = logging.getLogger(__name__)

MATMUL_MARGIN = 0.9  # matmul is taken when it needs at most 90% of SDPA's time
STABLE_SHAPE_COST = 1.5  # on CUDA: attention whose new shapes cost at most 1.5x known ones

# One timed forward+backward of attention with a kernel ("sdpa" or "matmul") -> seconds.
AttentionMeasure = Callable[[str], float]


@dataclass(frozen=True)
class AttentionShape:
    """The attention a run computes most: `batch` sentences of `length` tokens (about
    `max_tokens` in all), `heads` heads of `head_dim`."""

    batch: int
    length: int
    heads: int
    head_dim: int

    @classmethod
    def of_run(
        cls, max_tokens: int, mean_length: float, d_model: int, heads: int
    ) -> AttentionShape:
        length = int(min(max(round(mean_length), 4), 512))
        return cls(max(1, max_tokens // length), length, heads, d_model // heads)


@dataclass(frozen=True)
class AttentionTiming:
    """Seconds per forward+backward of each kernel: the fastest of interleaved runs."""

    sdpa_s: float
    matmul_s: float

    @property
    def kernel(self) -> str:
        return "matmul" if self.matmul_s <= MATMUL_MARGIN * self.sdpa_s else "sdpa"

    def as_dict(self) -> dict:
        return {"sdpa_ms": round(self.sdpa_s * 1e3, 3), "matmul_ms": round(self.matmul_s * 1e3, 3)}


def attention_timer(shape: AttentionShape, dtype: torch.dtype | None) -> AttentionMeasure:
    """A measure of forward+backward of padding-masked attention at `shape` under `dtype`
    autocast (None: fp32); a quarter of the keys are padding, as in a real batch."""
    generator = torch.Generator().manual_seed(0)
    b, t, h, k = shape.batch, shape.length, shape.heads, shape.head_dim
    q, key, v = (torch.randn(b, h, t, k, generator=generator) for _ in range(3))
    lengths = torch.randint(max(1, 3 * t // 4), t + 1, (b,), generator=generator)
    mask = (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)

    def once(kernel: str) -> float:
        inputs = [x.clone().requires_grad_() for x in (q, key, v)]
        start = time.perf_counter()
        with autocast("cpu", dtype):
            if kernel == "matmul":
                out = matmul_attention(*inputs, mask, causal=False)
            else:
                out = F.scaled_dot_product_attention(*inputs, attn_mask=mask)
        out.float().sum().backward()
        return time.perf_counter() - start

    return once


def time_attention(measure: AttentionMeasure, repeats: int = 7) -> AttentionTiming:
    """Both kernels warmed up, then each one's fastest of interleaved runs
    (`device.fastest_interleaved`, as the precision calibration times)."""
    for kernel in ("sdpa", "matmul", "sdpa", "matmul"):
        measure(kernel)
    best = fastest_interleaved(measure, ("sdpa", "matmul"), repeats)
    return AttentionTiming(sdpa_s=best["sdpa"], matmul_s=best["matmul"])


def choose_attention(
    asked: str,
    device: torch.device,
    dtype: torch.dtype | None,
    shape: AttentionShape,
    measure: AttentionMeasure | None = None,
) -> dict:
    """The kernel record of a run: {"kernel", "asked", "sdpa_ms"?, "matmul_ms"?, ...}.
    `auto` measures on a CPU (on one thread) and on CUDA (`choose_device_attention`);
    `measure` replaces the real timer (on CUDA a `KernelShapeMeasure`)."""
    if asked != "auto":
        return {"kernel": asked, "asked": asked}
    if device.type == "cuda":
        return choose_device_attention(
            device, dtype, shape, measure or device_attention_timer(shape, dtype, device)
        )
    timing = (
        time_attention(measure)
        if measure is not None
        else on_one_thread(lambda: time_attention(attention_timer(shape, dtype)))
    )
    log.info(
        "attention auto: %d x %d heads of %d x %d, forward+backward in %s, took "
        "%.2f ms with SDPA and %.2f ms with matmul + softmax on this CPU: %s",
        shape.batch,
        shape.heads,
        shape.length,
        shape.head_dim,
        "bf16" if dtype is not None else "fp32",
        timing.sdpa_s * 1e3,
        timing.matmul_s * 1e3,
        timing.kernel,
    )
    return {"kernel": timing.kernel, "asked": asked, **timing.as_dict()}


# One timed forward+backward of attention with a kernel ("sdpa" or "matmul") at the run's
# length plus `extra` positions -> seconds. extra 0 is the run's own shape; each new extra
# is a shape the kernel has not met (its first call pays for that shape's plans).
KernelShapeMeasure = Callable[[str, int], float]


@dataclass(frozen=True)
class ShapeTiming:
    """Seconds of a forward+backward at a shape the kernel meets for the first time, and
    at one it knows: the fastest of a few of each."""

    new_s: float
    known_s: float

    @property
    def stable(self) -> bool:
        return self.new_s <= STABLE_SHAPE_COST * self.known_s


def device_attention_timer(
    shape: AttentionShape, dtype: torch.dtype | None, device: torch.device
) -> KernelShapeMeasure:
    """A measure of forward+backward of padding-masked attention on `device` at `shape`
    lengthened by `extra` positions, under `dtype` autocast, timed between two device
    synchronisations (the inputs are made outside the timing)."""
    generator = torch.Generator(device=device).manual_seed(0)

    def once(kernel: str, extra: int) -> float:
        b, t, h, k = shape.batch, shape.length + extra, shape.heads, shape.head_dim
        q, key, v = (
            torch.randn(b, h, t, k, generator=generator, device=device).requires_grad_()
            for _ in range(3)
        )
        lengths = torch.randint(max(1, 3 * t // 4), t + 1, (b,), generator=generator, device=device)
        mask = (torch.arange(t, device=device)[None, :] < lengths[:, None])[:, None, None, :]
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        with autocast(device, dtype):
            if kernel == "matmul":
                out = matmul_attention(q, key, v, mask, causal=False)
            else:
                out = F.scaled_dot_product_attention(q, key, v, attn_mask=mask)
        out.float().sum().backward()
        torch.cuda.synchronize(device)
        return time.perf_counter() - start

    return once


# Lengths that timing new shapes has added in this process (a shape is new only once).
_fresh_extra = itertools.count(1)


def time_kernel_shapes(
    measure: KernelShapeMeasure, kernels: tuple[str, ...] = ("sdpa", "matmul"), repeats: int = 3
) -> dict[str, ShapeTiming]:
    """Each kernel's `ShapeTiming`: after two warm-up calls at the run's shape, the
    fastest of `repeats` calls there (known), and of `repeats` first calls at lengths
    never timed before in this process (new)."""
    for kernel in kernels:
        measure(kernel, 0)
        measure(kernel, 0)
    timings = {}
    for kernel in kernels:
        known = min(measure(kernel, 0) for _ in range(repeats))
        new = min(measure(kernel, next(_fresh_extra)) for _ in range(repeats))
        timings[kernel] = ShapeTiming(new, known)
    return timings


def choose_device_attention(
    device: torch.device,
    dtype: torch.dtype | None,
    shape: AttentionShape,
    measure: KernelShapeMeasure,
) -> dict:
    """`auto` on CUDA: {"kernel", "asked", "sdpa_ms", "matmul_ms", "sdpa_new_shape_ms",
    "matmul_new_shape_ms"}. Among the kernels whose new shapes cost at most
    `STABLE_SHAPE_COST` times a known one (all of them if none), matmul + softmax where
    it needs at most `MATMUL_MARGIN` of SDPA's time at a known shape (or SDPA is not
    among them), else SDPA. A measurement that fails (this path has not yet met every
    GPU) keeps SDPA, and says so."""
    try:
        timings = time_kernel_shapes(measure)
    except RuntimeError as e:
        log.warning("attention auto: measuring on %s failed (%s); SDPA", device, e)
        return {"kernel": "sdpa", "asked": "auto", "failed": first_line(e)}
    pool = {k: t for k, t in timings.items() if t.stable} or timings
    if "sdpa" not in pool or (
        "matmul" in pool and pool["matmul"].known_s <= MATMUL_MARGIN * pool["sdpa"].known_s
    ):
        kernel = "matmul"
    else:
        kernel = "sdpa"
    log.info(
        "attention auto: %d x %d heads of %d x %d, forward+backward in %s on %s: SDPA "
        "%.2f ms (%.2f ms at a new shape), matmul + softmax %.2f ms (%.2f ms at a new "
        "shape): %s",
        shape.batch,
        shape.heads,
        shape.length,
        shape.head_dim,
        "bf16" if dtype is not None else "fp32",
        device,
        timings["sdpa"].known_s * 1e3,
        timings["sdpa"].new_s * 1e3,
        timings["matmul"].known_s * 1e3,
        timings["matmul"].new_s * 1e3,
        kernel,
    )
    return {
        "kernel": kernel,
        "asked": "auto",
        **{f"{k}_ms": round(t.known_s * 1e3, 3) for k, t in timings.items()},
        **{f"{k}_new_shape_ms": round(t.new_s * 1e3, 3) for k, t in timings.items()},
    }


def decoding_attention_timer(
    shape: AttentionShape, dtype: torch.dtype | None, beam: int = 5
) -> AttentionMeasure:
    """A measure of the attention of one beam-search step, forward only, its tensors in
    `dtype` (None: fp32), as translation runs them: `batch` rows, each one query over
    its `length` positions so far (self-attention), and the same rows as `beam` queries
    per sentence over a source of `length` positions, a quarter of them padding
    (cross-attention)."""
    generator = torch.Generator().manual_seed(0)
    b, t, h, k = shape.batch, shape.length, shape.heads, shape.head_dim
    n = max(1, b // beam)  # sentences

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(dtype or torch.float32)

    query, keys, values = randn(b, h, 1, k), randn(b, h, t, k), randn(b, h, t, k)
    beams, src_k, src_v = randn(n, h, beam, k), randn(n, h, t, k), randn(n, h, t, k)
    lengths = torch.randint(max(1, 3 * t // 4), t + 1, (n,), generator=generator)
    mask = (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]  # (n, 1, 1, T)

    def once(kernel: str) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            if kernel == "matmul":
                matmul_attention(query, keys, values, None, causal=False)
                matmul_attention(beams, src_k, src_v, mask, causal=False)
            else:
                F.scaled_dot_product_attention(query, keys, values)
                F.scaled_dot_product_attention(beams, src_k, src_v, attn_mask=mask)
        return time.perf_counter() - start

    return once


def choose_decoding_attention(
    device: torch.device,
    dtype: torch.dtype | None,
    shape: AttentionShape,
    measure: AttentionMeasure | None = None,
) -> dict:
    """The attention kernel translation runs with: {"kernel", "sdpa_ms"?, "matmul_ms"?}.
    On a CPU it times one beam-search step's attention with each kernel
    (`decoding_attention_timer`, in the precision translation runs in) and takes matmul +
    softmax only where it is clearly faster. Logged at debug level
    (`translate` keeps stderr for errors); the engine keeps the record.

    On CUDA, matmul + softmax, unmeasured: SDPA there takes cuDNN's attention, which
    builds a plan for every new shape, and a search meets new shapes at every step (the
    keys grow by one, sentences leave the batch) (docs/performance.md,
    `benchmarks/profile_decode.py`).

    The real timer's choice is made once on a machine and kept (`tuning.measured`): a
    later process takes the same kernel, so that it translates the same input the same
    way; `measure` (a test's timings) is taken as it comes."""
    if device.type == "cuda":
        return {"kernel": "matmul"}
    if measure is not None:
        return _decoding_attention(dtype, shape, time_attention(measure))
    return remembered(
        "decoding attention",
        machine_key(shape=dataclasses.asdict(shape), dtype=str(dtype)),
        lambda: _decoding_attention(
            dtype,
            shape,
            on_one_thread(lambda: time_attention(decoding_attention_timer(shape, dtype))),
        ),
        _usable_decoding_attention,
    )


def _usable_decoding_attention(record: dict) -> bool:
    """Whether a kept decoding attention record is one this mtkit can run with: a kernel
    of `ATTENTION_KERNELS` (a later mtkit sharing the cache may keep another), and its
    timings, where it has them, times."""
    return record.get("kernel") in ATTENTION_KERNELS and holds_timings(
        record, ("sdpa_ms", "matmul_ms")
    )


def _decoding_attention(
    dtype: torch.dtype | None, shape: AttentionShape, timing: AttentionTiming
) -> dict:
    """The record of a decoding attention timing, logged at debug level."""
    log.debug(
        "attention for translation: a beam-search step of %d rows, %d heads of %d "
        "positions, in %s, took %.3f ms with SDPA and %.3f ms with matmul + softmax "
        "on this CPU: %s",
        shape.batch,
        shape.heads,
        shape.length,
        "bf16" if dtype is not None else "fp32",
        timing.sdpa_s * 1e3,
        timing.matmul_s * 1e3,
        timing.kernel,
    )
    return {"kernel": timing.kernel, **timing.as_dict()}


def translation_attention(cfg: Config, device: torch.device, precision: str) -> dict:
    """The attention kernel a checkpoint of `cfg` translates with in `precision` ("fp32",
    "bf16", "int8"): `choose_decoding_attention` at one beam-search step of a full batch
    (`precision.inference_shape`'s rows) over 16 positions."""
    rows, d_model, _ = inference_shape(
        cfg.decode.batch_tokens, cfg.model.d_model, cfg.model.ffn_dim
    )
    return choose_decoding_attention(
        device,
        torch.bfloat16 if precision == "bf16" else None,
        AttentionShape(rows, 16, cfg.model.heads, d_model // cfg.model.heads),
    )

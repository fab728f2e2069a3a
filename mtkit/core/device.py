"""Device policy: which device a command runs on, the autocast a pass runs in, the CPU's
description, and the process-wide CPU runtime settings, applied once by the CLI. What is
measured on the device (precision, kernels, shapes, capture) is `mtkit.tuning`'s.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from mtkit.core.errors import UserError

log = logging.getLogger(__name__)

# bf16 matrix products on a CPU run through oneDNN, which compiles a kernel for every
# matrix shape and keeps it, about 1-4 MB each, in two caches of 1,024 entries (its own
# primitive cache and PyTorch's ideep LRU cache; both read their size from the
# environment at their first use). Token-bucketed batches bring a hundred new shapes an
# epoch, so bf16 training of configs/multi30k.yaml grew without bound; with 32 entries it
# stays small at the same speed: the caches could not hold an epoch's kernels
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


def ranks_launched() -> bool:
    """Whether this process is one of several ranks that `torchrun` started (WORLD_SIZE
    above 1): training, translation and distillation then share the work."""
    return int(os.environ.get("WORLD_SIZE", 1)) > 1


def join_ranks(device: torch.device | str) -> tuple[int, int]:
    """This process's rank and the number of ranks, (0, 1) alone. Under `torchrun` the
    process group is started here unless it is (once per process): NCCL where `device`
    is CUDA, Gloo on a CPU, the ranks meeting through torchrun's env:// rendezvous
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), on one node or several."""
    if not ranks_launched():
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> AbstractContextManager:
    """The precision a pass runs in: autocast to `dtype` (bf16) on `device` (CUDA, or a
    CPU where `precision` chose bf16), or none, plain fp32, when `dtype` is None."""
    kind = device.type if isinstance(device, torch.device) else device
    return torch.autocast(kind, dtype=dtype or torch.float32, enabled=dtype is not None)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Within: torch's threads set to `count`; after: as they were."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    on denormal inputs. Make glibc keep large freed blocks instead of returning
    them to the OS: by default every allocation over 32 MB (logits, their gradient) gets
    fresh pages from the kernel, and the page faults cost more than the arithmetic on
    them; skipped where the C
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

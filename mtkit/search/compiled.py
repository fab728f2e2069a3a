"""Compiled decoder steps on a CPU: a search's steps on its growing cache run through one
function compiled by Inductor (`torch.compile`) with symbolic sizes, as fused C++ kernels.

    model = CompiledDecoder(transformer)        # a StepModel, as the transformer is
    beam_search(model, src, options)            # the same search, each step compiled

A decoder step is a few matrix products and many small operators between them (int8's
rounding of each input and scaling of each output, norms, residuals, the softmaxes, the
cache's reorder and append), each a pass over memory with Python between them. Inductor
fuses those into a few loops and calls oneDNN for the products. The step is compiled
once for every size that a search meets (`dynamic=True`: rows, sentences, source width
and positions are symbols), so a file of any lengths runs one graph for greedy search
and one for beam search (one row per sentence, or several), and two more where the search
asks for the decoder's output before its projection (a shortlist). The cache
is the search's own (`BeamCache`, grown by one position a step, the recorded reorder
applied in the same copy); a step in fixed shapes (`mtkit.search.captured`) attends
over every preallocated position and reorders the whole cache, which costs a CPU more
than compiling wins (`benchmarks/compiled_steps.py`).

What runs eagerly, as the model's own step: the first step (it makes the cache of the
source), a step where some size is below 2 (Dynamo would compile each size 0 or 1
apart: a batch's last sentence, the first position), a step while an attention is
watched (`mtkit.model.attention.watching`: alignments, `mtkit explain`), with gradients,
or of a cache that is not a `BeamCache` (a server's slots). At most `GRAPHS` graphs are
compiled in a process; past them, or where compiling fails (no C++ compiler, an
Inductor error), steps run eagerly, with one log line. A fork of the process that made
the decoder (a worker helper, `mtkit.engines.workers`) runs the graphs compiled before
it and compiles none: a kind of step without one runs eagerly there (`warm` compiles
them before the fork).

`compiled_step_timer` is what `--compile auto` times (`tuning.compile.compile_choice`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from mtkit.core.device import torch_threads
from mtkit.core.errors import first_line
from mtkit.core.search_options import SearchOptions
from mtkit.core.vocab import EOS
from mtkit.model.attention import watched
from mtkit.model.cache import BeamCache
from mtkit.search.beam import beam_search, greedy_search
from mtkit.tuning.timing import fastest_interleaved

log = logging.getLogger(__name__)

GRAPHS = 8  # compiled graphs of the step in a process, at most (then: eager steps)


class _Grown:
    """The cache as the compiled step sees it: each layer's keys/values (R, H, t, K) of
    the rows before the search's reorder, and the reorder `rows` (R',); `update` makes
    each layer's keys/values of the step, reordered and grown by one position (one
    fused copy once compiled). Nothing is written in place."""

    fixed_shapes = False

    def __init__(self, self_k: tuple[Tensor, ...], self_v: tuple[Tensor, ...], rows: Tensor):
        self.self_k, self.self_v, self.rows = self_k, self_v, rows

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, None]:
        old_k = self.self_k[layer].index_select(0, self.rows)
        old_v = self.self_v[layer].index_select(0, self.rows)
        return torch.cat([old_k, k], 2), torch.cat([old_v, v], 2), None


def grown_step(
    model: Any,
    token: Tensor,
    start: int,
    src_mask: Tensor,
    self_k: tuple[Tensor, ...],
    self_v: tuple[Tensor, ...],
    rows: Tensor,
    cross_k: tuple[Tensor, ...],
    cross_v: tuple[Tensor, ...],
    project: bool,
) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """One decoder step of `model` (a `Transformer`) on a grown cache, as a function of
    tensors (what Inductor compiles): token (R,), the `start` positions decoded so far,
    src_mask (B, S), each layer's keys/values (R0, H, start, K) and the reorder `rows`
    (R,) into them, the sources' keys/values (B, H, S, K). Returns the logits (R, V)
    (`project`) or the decoder's output (R, D), and each layer's keys/values (R, H,
    start + 1, K): what `Transformer.decode_step` / `decode_hidden` give on a
    `BeamCache`."""
    cache = _Grown(self_k, self_v, rows)
    attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
    y = model.tgt_embed(token[:, None], start, False)  # (R, 1, D)
    new_k, new_v = [], []
    for i, layer in enumerate(model.decoder_layers):
        y, (k, v) = layer(y, (cross_k[i], cross_v[i]), attn_mask, cache, i)
        new_k.append(k)
        new_v.append(v)
    out = model.project(y[:, 0]) if project else y[:, 0]
    return out, tuple(new_k), tuple(new_v)


ISA_FOLDER = "mtkit-cpu-"  # Inductor's disk cache of one vector ISA: ISA_FOLDER + its name


def cache_per_isa() -> str | None:
    """Point Inductor's disk cache (`TORCHINDUCTOR_CACHE_DIR`, by default
    /tmp/torchinductor_$USER) at a folder of the vector ISA its kernels are written for
    in this process (`ISA_FOLDER` + "avx512_avx512_vnni", "avx2", "INVALID_VEC_ISA"...), in the
    folder the user chose; returns it (None where PyTorch does not say the ISA).
    PyTorch's cache key does not hold the ISA, which a process picks from the CPU and
    `ATEN_CPU_CAPABILITY`: a graph cached for AVX-512 and read back under AVX2 steps
    its loops 16 floats wide with 8-wide vectors (wrong tokens), and the other way
    round it writes past its buffers (a crash). Idempotent; a child process that
    inherits a parent's folder of another ISA gets its own beside it."""
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another PyTorch's layout: its cache as it is
        return None
    isa = re.sub(r"[^A-Za-z0-9_]", "_", str(pick_vec_isa()) or "none")
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    chosen = os.path.abspath(chosen)
    if os.path.basename(chosen).startswith(ISA_FOLDER):  # an ISA's folder already
        chosen = os.path.dirname(chosen)
    folder = os.path.join(chosen, ISA_FOLDER + isa)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def inductor(fn: Callable) -> Callable:
    """`fn` compiled by Inductor for symbolic sizes, at most `GRAPHS` graphs of it (one
    more raises: its step then runs eagerly). Its kernels take the threads the process
    has when they run (`cpp.dynamic_threads`), not those it had when they were compiled:
    a worker helper forked after its engine compiled runs them on its own share
    (`mtkit.engines.workers`). Sizes that happen to be equal are not taken to be always
    equal (no duck sizing: the cache's rows before a step's reorder and after it).
    Compiled kernels are cached on disk per vector ISA (`cache_per_isa`)."""
    cache_per_isa()
    compiled = torch.compile(fn, dynamic=True, options={"cpp.dynamic_threads": True})

    def run(*args: Any) -> Any:
        with (
            torch._dynamo.config.patch(
                recompile_limit=GRAPHS, fail_on_recompile_limit_hit=True, specialize_float=True
            ),
            torch.fx.experimental._config.patch(use_duck_shape=False),
        ):
            return compiled(*args)

    return run


class _Hidden:
    """A compiled decoder stepped as a shortlist steps it (`decode_hidden`, then the
    projection): what `CompiledDecoder.warm` compiles too."""

    def __init__(self, decoder: CompiledDecoder):
        self.decoder = decoder

    def __getattr__(self, name: str) -> Any:
        return getattr(self.decoder.model, name)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any = None
    ) -> tuple[Tensor, Any]:
        y, cache = self.decoder.decode_hidden(token, memory, src_mask, cache)
        return self.decoder.model.project(y), cache


class CompiledDecoder:
    """A `Transformer` whose decoder steps on a `BeamCache` run compiled (`grown_step`
    through `compiler`, default `inductor`); everything else is the model's. A step the
    compiled code cannot take (see the module) runs eagerly; the first failure to compile
    is logged once and from then on every step runs eagerly."""

    def __init__(self, model: Any, compiler: Callable[[Callable], Callable] = inductor):
        self.model = model
        self.step = compiler(grown_step)
        self.compiled_steps = 0
        self.eager_steps = 0
        self.failure: str | None = None
        self.log_failures = True  # one warning (a measurement raises its own)
        # The process that made it: a fork of it (a worker helper) runs what this one
        # compiled and compiles nothing (Inductor's compiling threads are not in a fork)
        self.pid = os.getpid()
        self.refused: set[tuple[bool, bool]] = set()  # in a fork: kinds of step it lacks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def decode_step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any = None
    ) -> tuple[Tensor, Any]:
        return self._step(token, memory, src_mask, cache, project=True)

    def decode_hidden(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any = None
    ) -> tuple[Tensor, Any]:
        return self._step(token, memory, src_mask, cache, project=False)

    def compiles(self, token: Tensor, src_mask: Tensor, cache: Any) -> bool:
        """Whether this step runs compiled (see the module)."""
        return (
            self.failure is None
            and type(cache) is BeamCache
            and cache.length >= 2
            and min(token.size(0), *src_mask.shape) >= 2
            and not torch.is_grad_enabled()
            and not watched()
        )

    def _step(
        self, token: Tensor, memory: Tensor | None, src_mask: Tensor, cache: Any, project: bool
    ) -> tuple[Tensor, Any]:
        kind = (project, token.size(0) == src_mask.size(0))  # (projected, greedy)
        if self.compiles(token, src_mask, cache) and kind not in self.refused:
            rows = cache.rows
            if rows is None:  # not reordered: the same copy, every row in its place
                rows = torch.arange(token.size(0), device=token.device)
            forked = os.getpid() != self.pid
            try:
                with torch.compiler.set_stance("fail_on_recompile") if forked else nullcontext():
                    out, k, v = self.step(
                        self.model,
                        token,
                        cache.length,
                        src_mask,
                        tuple(cache.self_k),
                        tuple(cache.self_v),
                        rows,
                        cache.cross_k,
                        cache.cross_v,
                        project,
                    )
            except Exception as e:  # noqa: BLE001 - any failure to compile means: eager
                if forked:  # a graph its engine did not compile: such steps run eagerly
                    self.refused.add(kind)
                    log.debug("a worker helper steps eagerly: %s", first_line(e))
                else:
                    self.failure = first_line(e)
                    if self.log_failures:
                        log.warning("decoder steps run eagerly: %s", self.failure)
            else:
                self.compiled_steps += 1
                return out, BeamCache(k, v, cache.cross_k, cache.cross_v)
        self.eager_steps += 1
        step = self.model.decode_step if project else self.model.decode_hidden
        return step(token, memory, src_mask, cache)

    def warm(self, src_vocab_size: int, beam: int = 1, hidden: bool = False) -> None:
        """Compile the step now, as a search of `beam` steps it (greedy and beam search
        are two graphs: one row per sentence or several), with the projection or without
        (`hidden`: a shortlist's step), with a search of two seeded sentences, where it
        would otherwise be compiled at a search's third step: before worker helpers are
        forked, which inherit it (a fork compiles nothing, see `_step`). Dynamo's graphs
        hold for the threads and the precision (autocast) they were compiled under: warm
        under those the search will have."""
        generator = torch.Generator().manual_seed(0)
        low = min(EOS + 1, src_vocab_size - 1)
        src = torch.randint(low, src_vocab_size, (2, 4), generator=generator)
        src = src.to(next(self.model.parameters()).device)
        with torch.inference_mode():  # as the engine searches: its tensors' own graph
            stepper = _Hidden(self) if hidden else self
            options = SearchOptions(beam=beam, max_len_a=0.0, max_len_b=4)
            (greedy_search if beam == 1 else beam_search)(stepper, src, options)

    def record(self) -> dict:
        """What ran: steps compiled and eager, and why compiling stopped."""
        return {
            "compiled_steps": self.compiled_steps,
            "eager_steps": self.eager_steps,
            **({"failed": self.failure} if self.failure else {}),
        }


def compiled_step_timer(
    model: Any,
    src_vocab_size: int,
    batch_tokens: int,
    beam: int,
    compiler: Callable[[Callable], Callable] = inductor,
    source_len: int = 14,
    steps: int = 24,
    repeats: int = 2,
    threads: int | None = None,
) -> Callable[[], tuple[float, float, float]]:
    """What times `model`'s real decoder steps, eager against compiled by `compiler` (what
    `--compile auto` measures, `tuning.compile.compile_choice`): a search of one full
    batch, as translation makes them (`batch_tokens` source tokens over the `beam`,
    greedy for 1), of seeded sources of `source_len` tokens (ids past the special ones,
    below `src_vocab_size`), `steps` tokens out, by the model itself and through a
    `CompiledDecoder`, each the fastest of `repeats` interleaved runs, on `threads`
    threads (default: the process's): a worker's share, as translation will step.
    Returns (eager, compiled) seconds per step and the seconds the first compiled
    search took beyond a later one (compiling)."""

    def measure() -> tuple[float, float, float]:
        device = next(model.parameters()).device
        generator = torch.Generator().manual_seed(0)
        low = min(EOS + 1, src_vocab_size - 1)  # past the special ids
        shape = (max(2, batch_tokens // beam // (source_len + 1)), source_len)
        src = torch.randint(low, src_vocab_size, shape, generator=generator).to(device)
        options = SearchOptions(beam=beam, max_len_a=0.0, max_len_b=steps)
        search = greedy_search if beam == 1 else beam_search
        stepper = CompiledDecoder(model, compiler)
        stepper.log_failures = False  # raised below, and logged once by the caller
        steppers = {"eager": model, "compiled": stepper}

        def once(kind: str) -> float:
            start = time.perf_counter()
            with torch.inference_mode():  # as the engine searches (and compiles)
                search(steppers[kind], src, options)
            if stepper.failure:
                raise RuntimeError(stepper.failure)
            return time.perf_counter() - start

        first = once("compiled")  # compiles
        once("eager")  # warmed up
        best = fastest_interleaved(once, ("eager", "compiled"), repeats)
        return best["eager"] / steps, best["compiled"] / steps, first - best["compiled"]

    def measured() -> tuple[float, float, float]:
        with torch_threads(threads or torch.get_num_threads()):
            return measure()

    return measured

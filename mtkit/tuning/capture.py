"""Capture: a piece of CUDA work (a training update, a decoder step) recorded once as a
CUDA graph and replayed with one launch, and the choice, measured or asked for, of
whether a run's updates and a search's steps are captured.

`CAPTURES` is how each device captures; CUDA only, and tests add an eager stand-in for
the CPU. Training's updates (`mtkit.training.graphs`) and the decoder's steps
(`mtkit.search.captured`) both capture through it: `WARMUP_RUNS` runs of the work on a
side stream, then the recording.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from mtkit.core.config import TrainConfig
from mtkit.core.errors import first_line
from mtkit.core.search_options import check_cuda_graphs

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # runs of the work (skipped updates, eager steps) before its capture

# Records `work` once and returns what replays it (on CUDA: a captured graph's replay).
Capture = Callable[[Callable[[], None]], Callable[[], None]]


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


def cuda_capture(work: Callable[[], None]) -> Callable[[], None]:
    """`work` recorded as a CUDA graph (after `WARMUP_RUNS` runs of it on a side stream);
    returns the graph's replay."""
    return cuda_graph(work, WARMUP_RUNS)


# How each device captures. CUDA only; tests add an eager stand-in for the CPU.
CAPTURES: dict[str, Capture] = {"cuda": cuda_capture}


GRAPH_MARGIN = 0.9  # graphs are taken where a replayed update needs at most 90% of an eager one

# Seconds of one eager update and of one replayed update, on the run's device -> (eager, graph).
UpdateMeasure = Callable[[], tuple[float, float]]


def choose_graphs(
    asked: str,
    device: torch.device,
    tc: TrainConfig,
    distributed: bool,
    measure: UpdateMeasure | None,
) -> dict:
    """The record of `train.cuda_graphs`: {"graphs": "on" | "off", "asked", "why"?,
    "eager_ms"?, "graph_ms"?}. Graphs need CUDA, one process and one batch per update
    (`update_freq` 1): elsewhere the eager update runs, and the record says why. `auto`
    times an update of each kind (`measure`) and takes graphs where they need at most
    `GRAPH_MARGIN` of the eager time; `on` takes them unmeasured."""
    if asked == "off":
        return {"graphs": "off", "asked": asked}
    why = (
        "not on CUDA"
        if device.type not in CAPTURES
        else "under DDP"
        if distributed
        else "train.update_freq > 1"
        if tc.update_freq > 1
        else None
    )
    if why is not None:
        if asked == "on":
            log.warning("train.cuda_graphs=on, but updates run eagerly: %s", why)
        return {"graphs": "off", "asked": asked, "why": why}
    if asked == "on" or measure is None:
        return {"graphs": "on", "asked": asked}
    try:
        eager, graph = measure()
    except RuntimeError as e:
        log.warning("CUDA graphs auto: measuring failed (%s); eager updates", e)
        return {"graphs": "off", "asked": asked, "why": first_line(e)}
    chosen = "on" if graph <= GRAPH_MARGIN * eager else "off"
    log.info(
        "CUDA graphs auto: an update took %.2f ms eagerly and %.2f ms replayed: %s",
        eager * 1e3,
        graph * 1e3,
        "graphs" if chosen == "on" else "eager updates",
    )
    return {
        "graphs": chosen,
        "asked": asked,
        "eager_ms": round(eager * 1e3, 3),
        "graph_ms": round(graph * 1e3, 3),
    }


def graph_choice(asked: str, device: torch.device) -> dict:
    """Whether decoder steps run as graphs (`CapturedDecoder`), and its record:
    on and auto take them where the device captures steps (CUDA), off never."""
    check_cuda_graphs(asked, "cuda_graphs")
    if asked == "off":
        return {"graphs": "off", "asked": asked}
    if device.type not in CAPTURES:
        if asked == "on":
            log.warning("cuda_graphs=on, but decoder steps run eagerly on %s", device.type)
        return {"graphs": "off", "asked": asked, "why": f"no captured steps on {device.type}"}
    return {"graphs": "on", "asked": asked}

"""The one place that knows both engines: `-m` names checkpoint file(s) (the PyTorch
engine; several make an ensemble) or a folder made by `mtkit export` (CTranslate2).
Each engine is imported only when chosen: an exported folder is translated without
loading torch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mtkit.core.errors import OptionError
from mtkit.core.search_options import (
    check_compile,
    check_cuda_graphs,
    check_precision,
    check_workers,
)
from mtkit.engines.base import Engine


def wants_ctranslate2(paths: Sequence[str | os.PathLike]) -> bool:
    """Whether `-m` names a folder (made by `mtkit export`) rather than checkpoint files:
    then CTranslate2 translates, and torch is never loaded."""
    return any(Path(p).is_dir() for p in paths)


def model_files(paths: Sequence[str | os.PathLike]) -> dict[str, list[Path]]:
    """Every file that loading `-m paths` reads, under the option's name ("--model",
    "--model #2", ...): a checkpoint file, or each file of an exported folder. An output
    must be none of them."""
    files = {}
    for i, p in enumerate(map(Path, paths)):
        files["--model" + (f" #{i + 1}" if i else "")] = (
            sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        )
    return files


def load_engine(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    device: str = "auto",
    device_option: str = "--device",
    precision: str | None = None,
    cuda_graphs: str | None = None,
    workers: int | None = None,
    compile: str | None = None,
) -> Engine:
    """The engine of checkpoint file(s) or of an exported folder. `device_option` names
    the option `device` came from, for the error when it cannot be used. `precision`
    (None: the checkpoint's decode.precision) is the PyTorch engine's; an exported
    folder runs in the compute type it was exported with, and refuses bf16.
    `cuda_graphs` (None: the checkpoint's decode.cuda_graphs) is the PyTorch engine's
    too; CTranslate2 has its own runtime. `workers` (None: the checkpoint's
    decode.workers): batches translated at once on a CPU, by either engine. `compile`
    (None: the checkpoint's decode.compile): the PyTorch engine's decoder steps compiled
    on a CPU (`mtkit.tuning.compile`)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if precision is not None:
        check_precision(precision)
    if cuda_graphs is not None:
        check_cuda_graphs(cuda_graphs)
    if workers is not None:
        check_workers(workers)
    if compile is not None:
        check_compile(compile)
    if not wants_ctranslate2(paths):
        from mtkit.engines.pytorch_loading import load_torch_engine

        return load_torch_engine(
            paths, device, device_option, precision, cuda_graphs, workers, compile
        )
    from mtkit.engines.ct2 import CT2Engine, looks_exported

    folder = next(Path(p) for p in paths if Path(p).is_dir())
    if not looks_exported(folder):
        raise OptionError(
            f"{folder} is a folder but not an exported model (no "
            f"mtkit.json and model.bin); -m takes a checkpoint file or a "
            f"folder made by mtkit export"
        )
    if len(paths) > 1:
        raise OptionError(
            "an ensemble needs checkpoints; an exported CTranslate2 folder translates alone"
        )
    if precision in ("bf16", "int8"):
        raise OptionError(
            f"--precision {precision} needs a checkpoint (-m FILE.pt); an exported "
            "CTranslate2 folder runs in the type it was exported with "
            "(mtkit export --quantization)"
        )
    return CT2Engine(folder, device, device_option, workers)

"""The precision a PyTorch engine's models run in, once chosen
(`mtkit.tuning.precision.inference_precision`): int8 layers (`mtkit.model.int8`), bf16
weights on a CPU (`bf16_weights`), or as loaded (fp32, and bf16 autocast on CUDA)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from mtkit.core.checkpoint import MappedFile
from mtkit.model import int8
from mtkit.model.transformer import Transformer


def in_precision(
    models: list[Transformer],
    paths: Sequence[str | os.PathLike],
    record: dict,
    dtype: torch.dtype | None,
    device: torch.device,
) -> tuple[list[Transformer], torch.dtype | None]:
    """The models (loaded from `paths`) in the precision of `record`, and the autocast
    dtype searches then run in: int8 layers; on a CPU, bf16 weights and no autocast;
    else as they are, with `dtype`. Each model's checkpoint pages are released as its
    weights are replaced."""
    if record["precision"] == "int8":
        return [
            int8.quantize(model, MappedFile(Path(path)).release)
            for model, path in zip(models, paths, strict=True)
        ], dtype
    if dtype is not None and device.type == "cpu":  # bf16 weights, not autocast
        return [
            bf16_weights(model, MappedFile(Path(path)).release)
            for model, path in zip(models, paths, strict=True)
        ], None
    return models, dtype


def bf16_weights(
    model: Transformer, release: Callable[[torch.Tensor], None] | None = None
) -> Transformer:
    """The model with its weights in bf16, for translation on a CPU: every product,
    LayerNorm and residual runs in bf16, where bf16 autocast would cast each Linear's
    input to bf16 and its output back, and keep a bf16 copy of each weight beside the
    fp32 one. Faster than autocast, with outputs and BLEU as close to fp32
    (docs/translation.md); the logits are made log-probabilities in fp32
    (`beam.step_log_probs`). Each fp32 tensor is handed to `release` as soon
    as it is cast (a loaded model's are a checkpoint's mapped pages), so that the model
    is never resident in both precisions. In place; returns the model."""
    cast: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (fp32, bf16), tied
    for module in list(model.modules()):  # weights cast once (the fp32 kept: ids stay)
        for name, t in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            if not t.is_floating_point():
                continue
            if id(t) not in cast:
                new = t.detach().to(torch.bfloat16)
                cast[id(t)] = (
                    t,
                    torch.nn.Parameter(new, t.requires_grad)
                    if isinstance(t, torch.nn.Parameter)
                    else new,
                )
                if release is not None:
                    release(t.detach())
            setattr(module, name, cast[id(t)][1])
    return model

"""Fine-tuning's start: `train.init_from` names a checkpoint (or a run directory's final
model) whose model section the run takes (`init_model_config`), whose weights it starts
from (`init_weights`: all its layers, or those `train.init_encoder_layers` /
`init_decoder_layers` choose), with the run's own tokenizers; `train.freeze` keeps the
embeddings or the encoder as they are."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from torch import Tensor

from mtkit.core.checkpoint import describe_weights, load_checkpoint, trained_model
from mtkit.core.config import Config, config_from_dict
from mtkit.core.configcheck import ConfigError
from mtkit.core.errors import TrainError, plural
from mtkit.core.vocab import Vocab, entry_vocabs
from mtkit.model.transformer import Transformer

log = logging.getLogger("mtkit.training.loop")  # one stage: its lines read "mtkit.training.loop"


def init_model_config(cfg: Config, source: Path | None) -> Config:
    """With `train.init_from`, the run's model section is the checkpoint's, but for the
    dropout rates (training settings: this config's) and the layer counts, where
    `train.init_encoder_layers` / `init_decoder_layers` choose some of its layers.
    `source`: that checkpoint (`init_checkpoint`), None without init_from."""
    tc = cfg.train
    if source is None:
        for side in ("encoder", "decoder"):
            if getattr(tc, f"init_{side}_layers"):
                raise ConfigError(
                    f"train.init_{side}_layers chooses layers of train.init_from, which is not set"
                )
        return cfg
    theirs = config_from_dict(load_checkpoint(source, mmap=True)["config"], str(source)).model
    counts = {}
    for side in ("encoder", "decoder"):
        chosen, have = getattr(tc, f"init_{side}_layers"), getattr(theirs, f"{side}_layers")
        wrong = [i for i in chosen if not 0 <= i < have]
        if wrong:
            raise TrainError(
                f"train.init_{side}_layers: {source} has {plural(have, f'{side} layer')} "
                f"(0 to {have - 1}), not {wrong[0]}"
            )
        if chosen:
            counts[f"{side}_layers"] = len(chosen)
    return replace(
        cfg,
        model=replace(
            theirs,
            dropout=cfg.model.dropout,
            attention_dropout=cfg.model.attention_dropout,
            **counts,
        ),
    )


def init_checkpoint(init_from: str) -> Path:
    """`train.init_from` as a checkpoint file: as given, or a run directory's final model."""
    path = Path(init_from)
    if path.is_dir():
        # Without the run's lock, which each rank of a distributed run would ask for at
        # once: average.pt is written atomically, so ranks that average together each
        # leave the same whole file.
        model = trained_model(path)
        if model is None:
            raise TrainError(f"train.init_from: {init_from} has no trained model yet")
        return model
    if not path.is_file():
        raise TrainError(f"train.init_from: {init_from}: no such checkpoint or run directory")
    return path


def chosen_layers(
    weights: dict[str, Tensor], encoder: tuple[int, ...], decoder: tuple[int, ...]
) -> dict[str, Tensor]:
    """A model's weights with only the chosen layers of each stack (indices; empty: all),
    renumbered from 0 in the order given: `encoder_layers.2.*` chosen first becomes
    `encoder_layers.0.*`."""
    out = {}
    for name, value in weights.items():
        stack, _, rest = name.partition(".")
        chosen = {"encoder_layers": encoder, "decoder_layers": decoder}.get(stack)
        if not chosen:
            out[name] = value
            continue
        index, _, rest = rest.partition(".")
        for new, old in enumerate(chosen):
            if old == int(index):
                out[f"{stack}.{new}.{rest}"] = value
    return out


def init_weights(cfg: Config, path: Path, model: Transformer, vocabs: tuple[Vocab, Vocab]) -> None:
    """`train.init_from` (resolved: `path`): the checkpoint's weights (its chosen
    layers), which need the run's tokenizers."""
    tc = cfg.train
    payload = load_checkpoint(path, mmap=True)
    theirs = entry_vocabs(payload["vocab"])
    if not (theirs[0].same(vocabs[0]) and theirs[1].same(vocabs[1])):
        raise TrainError(
            f"train.init_from: {path} has other tokenizers than the run's; set "
            f"tokenizer.from: {tc.init_from}, then run mtkit tokenizer and preprocess "
            f"again"
        )
    model.load_state_dict(
        chosen_layers(payload["model"], tc.init_encoder_layers, tc.init_decoder_layers)
    )
    chosen = [
        f"{'layer' if len(layers) == 1 else 'layers'} {', '.join(map(str, layers))} of the {side}"
        for side, layers in (
            ("encoder", tc.init_encoder_layers),
            ("decoder", tc.init_decoder_layers),
        )
        if layers
    ]
    log.info(
        "starting from the weights of %s (%s)%s",
        path,
        describe_weights(payload),
        f": its {' and '.join(chosen)}" if chosen else "",
    )


def freeze(model: Transformer, what: str) -> None:
    """`train.freeze`: no gradients for the embeddings (and so the tied output
    projection), the encoder, or both."""
    parts = {
        "embeddings": (model.src_embed, model.tgt_embed),
        "encoder": (model.encoder_layers, model.encoder_norm),
    }
    for name in () if what == "none" else what.split("+"):
        for module in parts[name]:
            module.requires_grad_(False)

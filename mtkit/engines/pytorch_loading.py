"""Loading the PyTorch engine: a checkpoint's model, vocabularies, config and shortlist
(`load_model`), and the engine of one checkpoint or of an ensemble
(`load_torch_engine`), its choices measured on the machine at load (`mtkit.tuning`); a
helper process loads the same engine again (`helper_engine`). `mtkit.engines.loader`
chooses between this engine and CTranslate2."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from mtkit.core.checkpoint import (
    CheckpointError,
    check_shortlist,
    describe_weights,
    load_checkpoint,
    trained_step,
)
from mtkit.core.config import Config, config_from_dict
from mtkit.core.device import resolve_device, tune_cpu_runtime
from mtkit.core.search_options import cpu_workers, worker_threads
from mtkit.core.vocab import Vocab, entry_vocabs
from mtkit.engines.pytorch import TorchEngine
from mtkit.engines.pytorch_precision import in_precision
from mtkit.model.attention import keep_stacked_weights
from mtkit.model.transformer import Transformer, build_model
from mtkit.search.compiled import compiled_step_timer
from mtkit.search.shortlist import Shortlist
from mtkit.tuning.attention import translation_attention
from mtkit.tuning.budget import gpu_batch_budget
from mtkit.tuning.capture import graph_choice
from mtkit.tuning.compile import compile_choice
from mtkit.tuning.precision import inference_precision

log = logging.getLogger(__name__)


class Weights(NamedTuple):
    """What a checkpoint's weights are: its training step (None: an average) and the
    same for people (`checkpoint.describe_weights`: "the average of steps 800 and 900")."""

    step: int | None
    about: str
    # SHA-256 of the checkpoint's content (its stored digest, checked on load): the same
    # digest, the same weights
    digest: str = ""


class Loaded(NamedTuple):
    """What a checkpoint holds for translation."""

    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab
    config: Config
    weights: Weights
    shortlist: Shortlist | None  # a distilled student's (`mtkit.search.shortlist`)


def load_model(path: str | os.PathLike) -> Loaded:
    """A checkpoint's model, vocabularies, config, what its weights are, and its lexical
    shortlist where it has one (checked against the vocabularies: `check_shortlist`). The
    checkpoint is read memory-mapped and the model's weights are its own (copy on
    write: nothing is written back): its training state is never read, and the weights
    are in memory once, paged in as they are used, not first drawn at random and then
    copied over."""
    payload = load_checkpoint(path, mmap=True)
    try:
        cfg = config_from_dict(payload["config"], str(path))
        src_vocab, tgt_vocab = entry_vocabs(payload["vocab"])
        model = build_model(cfg.model, len(src_vocab), len(tgt_vocab), initialize=False)
        model.load_state_dict(payload["model"], assign=True)
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: checkpoint is incomplete or does not match its "
            f"config ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        ) from None
    shortlist = None
    if "shortlist" in payload:  # checked: a search with it indexes the output layer
        check_shortlist(
            payload["shortlist"],
            len(src_vocab),
            len(tgt_vocab),
            Path(path),
            "this checkpoint cannot be used; rerun `mtkit distill`, then `mtkit train` "
            "writes checkpoints with a checked one",
        )
        shortlist = Shortlist.of_entry(payload["shortlist"])
    return Loaded(
        model,
        src_vocab,
        tgt_vocab,
        cfg,
        Weights(
            trained_step(payload),
            describe_weights(payload),
            payload["digest"],
        ),
        shortlist,
    )


def load_torch_engine(
    paths: Sequence[str | os.PathLike],
    device: str = "auto",
    device_option: str = "--device",
    precision: str | None = None,
    cuda_graphs: str | None = None,
    workers: int | None = None,
    compile: str | None = None,
) -> TorchEngine:
    """Everything translation needs comes from the checkpoint file(s); several files make
    an ensemble, whose models must share the source and the target vocabulary (decoding
    defaults come from the first). `device_option` names the option `device` came from,
    for the error when it cannot be used. `precision` (None: the checkpoint's
    decode.precision): auto, fp32, bf16 or int8 (`tuning.precision.inference_precision`);
    `cuda_graphs` (None: the checkpoint's decode.cuda_graphs): auto, on or off
    (`tuning.capture.graph_choice`); `workers` (None: the checkpoint's decode.workers; 0:
    auto, `cpu_workers`): batches translated at once on a CPU (`mtkit.engines.workers`);
    `compile` (None: the checkpoint's decode.compile): auto, on or off, decoder steps
    compiled on a CPU (`tuning.compile.compile_choice`). The measured choices are made
    here, in this order: precision, attention kernel, captured steps, compiled steps, the
    GPU batch budget (`mtkit.tuning`)."""
    dev = resolve_device(device, device_option)
    loaded = [load_model(p) for p in paths]
    first, (_, src_vocab, tgt_vocab, cfg, _, shortlist) = paths[0], loaded[0]
    for path, (_, src, tgt, *_) in zip(paths[1:], loaded[1:], strict=True):
        for side, mine, theirs in (("source", src, src_vocab), ("target", tgt, tgt_vocab)):
            if not mine.same(theirs):
                raise CheckpointError(
                    f"{path} and {first} have different {side} "
                    f"vocabularies; the models of an ensemble must share "
                    f"their tokenizers"
                )
    models = [model.to(dev).eval() for model, *_ in loaded]
    dtype, record = inference_precision(precision or cfg.decode.precision, dev, cfg)
    models, dtype = in_precision(models, paths, record, dtype, dev)
    record["attention"] = translation_attention(cfg, dev, record["precision"])
    for model in models:
        model.use_attention(record["attention"]["kernel"])
        keep_stacked_weights(model)  # its weights are final now
    record["graphs"] = graph_choice(cuda_graphs or cfg.decode.cuda_graphs, dev)
    threads = torch.get_num_threads()
    workers = cpu_workers(cfg.decode.workers if workers is None else workers, threads)
    step_threads = worker_threads(workers, threads)  # what each batch's steps run on
    record["compile"] = compile_choice(
        compile or cfg.decode.compile,
        dev,
        {
            "model": compiled_shape(models[0], len(src_vocab)),
            "precision": record["precision"],
            "attention": record["attention"]["kernel"],
            "batch": [cfg.decode.batch_tokens, cfg.decode.beam],
            "step_threads": step_threads,
        },
        compiled_step_timer(
            models[0],
            len(src_vocab),
            cfg.decode.batch_tokens,
            cfg.decode.beam,
            threads=step_threads,
        ),
    )
    budget = gpu_batch_budget(cfg, dev, len(tgt_vocab), 2 if dtype is not None else 4, len(models))
    if budget is not None:
        record["batch_tokens"] = budget
    return TorchEngine(
        models,
        src_vocab,
        tgt_vocab,
        dev,
        dtype,
        cfg,
        [x.weights.step for x in loaded],
        [x.weights.about for x in loaded],
        record,
        shortlist,
        record["graphs"]["graphs"] == "on",
        workers if dev.type == "cpu" else 1,
        [str(p) for p in paths],
        [x.weights.digest for x in loaded],
        helper_engine,
        compiled=record["compile"]["compile"] == "on",
    )


def compiled_shape(model: Transformer, src_vocab_size: int) -> list[int]:
    """What a compiled step's measurement depends on of the model (with the precision and
    the attention kernel, its key in measured.json, `tuning.compile`): [decoder layers,
    d_model, heads, ffn_dim, source vocabulary, target vocabulary]."""
    cfg = model.cfg
    return [
        cfg.decoder_layers,
        cfg.d_model,
        cfg.heads,
        cfg.ffn_dim,
        src_vocab_size,
        model.vocab_size,
    ]


def helper_engine(
    paths: list[str],
    precision: str,
    attention: str | None,
    digests: list[str] | None = None,
    compile: str = "off",
) -> TorchEngine:
    """The engine a spawned helper process loads (`mtkit.engines.workers`): the same
    checkpoint files, precision, attention kernel and compiled steps (`compile`: on or
    off, the engine's choice) as its engine's, on the CPU, one batch at a time.
    `digests`: the engine's models' (`Weights.digest`); a file that holds other weights
    now (replaced since the engine loaded it) is a `CheckpointError`: one command
    translates with one model."""
    tune_cpu_runtime()
    engine = load_torch_engine(paths, "cpu", precision=precision, workers=1, compile=compile)
    for path, loaded, wanted in zip(paths, engine.digests, digests or engine.digests, strict=True):
        if loaded != wanted:
            raise CheckpointError(
                f"the model file changed since this command loaded it: {path} holds "
                f"other weights now; run the command again"
            )
    if attention is not None:
        engine.use_attention(attention)
    return engine

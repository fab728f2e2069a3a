"""Where a run stands (`Progress`), and resuming it: the checks that a resumed run is the
same run (every rank found the same checkpoint; the same model section, shards and
tokenizer), and `restore`, which gives back the weights, the optimizer, the RNG streams
and the `Progress` (step, epoch, batch within the epoch), so that training goes on
exactly where it stopped. The run's measured choices are resumed by
`mtkit.tuning.run.decided_once`."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from mtkit.core.checkpoint import CheckpointError
from mtkit.core.config import Config, ModelConfig, config_to_dict
from mtkit.core.errors import TrainError
from mtkit.core.vocab import Vocab
from mtkit.data.shards import ShardDataset
from mtkit.model.transformer import Transformer

log = logging.getLogger("mtkit.training.loop")  # one stage: its lines read "mtkit.training.loop"


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 1
    batch: int = 0  # batches of `epoch` already consumed (this rank)
    best_bleu: float = -1.0
    bad_validations: int = 0
    elapsed: float = 0.0  # seconds of training, over all sessions
    early_stopped: bool = False  # patience ran out: resuming changes nothing


def restore(
    cfg: Config,
    found: tuple[Path, dict] | None,
    resume: bool,
    model: Transformer,
    optimizer,
    train_data: ShardDataset,
    vocabs: tuple[Vocab, Vocab],
    rank: int,
    world: int,
) -> Progress:
    """Load the newest intact checkpoint (`found`) into model and optimizer and return its
    progress; a fresh `Progress` when there is none (with --no-resume, old checkpoints
    move aside)."""
    tc, ckpt_dir = cfg.train, cfg.run_path / "checkpoints"
    if found is None:
        if not resume and rank == 0 and ckpt_dir.exists() and any(ckpt_dir.iterdir()):
            aside = ckpt_dir.with_name(f"checkpoints.{time.strftime('%Y%m%d-%H%M%S')}")
            ckpt_dir.rename(aside)
            log.warning("--no-resume: starting over; earlier checkpoints moved to %s", aside)
        if rank > 0:
            torch.manual_seed(tc.seed + 1000 * rank)
        return Progress()
    path, payload = found
    try:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["train"]["optimizer"])
        progress = Progress(**payload["train"]["progress"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{path}: cannot resume from it ({type(e).__name__}: {str(e).splitlines()[0][:100]})"
        ) from None
    others = payload["train"].get("rng_of_ranks", [])
    if rank == 0:
        set_rng_state(payload["train"]["rng"])
    elif len(others) == world - 1:
        set_rng_state(others[rank - 1])
    else:  # saved by a run of another world size, or by an mtkit that kept rank 0's only
        log.warning(
            "%s holds the RNG streams of %d rank(s), not %d: rank %d draws a fresh one",
            path,
            len(others) + 1,
            world,
            rank,
        )
        torch.manual_seed(tc.seed + 1000 * rank + progress.step)
    log.info(
        "resuming from %s at step %d (epoch %d, batch %d)",
        path,
        progress.step,
        progress.epoch,
        progress.batch,
    )
    return progress


def same_start_on_every_rank(found: tuple[Path, dict] | None, run: Path) -> None:
    """Under DDP every rank resumes from the newest checkpoint in its own view of the run
    directory: refused on every rank, in one line, unless all found the same step (or
    none), as they do where the nodes share the run directory. A rank that started over
    beside one that resumed would take other batches and stop at another step."""
    step = None if found is None else found[1]["train"]["progress"]["step"]
    steps: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(steps, step)
    if len(set(steps)) > 1:
        seen = ", ".join(
            f"rank {r}: {'none' if s is None else f'step {s}'}" for r, s in enumerate(steps)
        )
        raise TrainError(
            f"the ranks found different checkpoints to resume from in {run} ({seen}); "
            f"every node must see the same run directory (shared storage)"
        )


# What resuming reads of a checkpoint beyond what `load_checkpoint` checks; every
# checkpoint training writes holds it (`checkpoint.training_payload`).
RESUMED = (
    *(("config", "model", f.name) for f in dataclasses.fields(ModelConfig)),
    ("train", "optimizer"),
    ("train", "rng"),
    ("train", "progress"),
    ("train", "shards"),
    ("train", "precision", "precision"),
    ("train", "precision", "attention"),
    ("train", "precision", "batches"),
    ("train", "precision", "graphs"),
)


def check_complete(payload: dict, path: Path) -> None:
    """Refuse, in one line, to resume from a checkpoint that lacks a part resuming reads
    (`RESUMED`: one written by another mtkit version, or by hand)."""
    for keys in RESUMED:
        part = payload
        for key in keys:
            if not isinstance(part, dict) or key not in part:
                raise TrainError(
                    f"{path}: checkpoint is incomplete (no {'.'.join(keys)}); start over "
                    f"with --no-resume, or use another run_dir"
                )
            part = part[key]


def check_same_model(cfg: Config, payload: dict, path: Path) -> None:
    """Refuse to resume with another model section."""
    saved = payload["config"]["model"]
    now = config_to_dict(cfg)["model"]
    diff = [k for k in now if saved[k] != now[k]]
    if diff:
        k = diff[0]
        raise TrainError(
            f"{path} was trained with model.{k}={saved[k]!r}, the config "
            f"says {now[k]!r}; use another run_dir or --no-resume"
        )


def check_same_data(
    payload: dict, path: Path, train_data: ShardDataset, vocabs: tuple[Vocab, Vocab]
) -> None:
    """Refuse to resume on shards or a tokenizer other than those the checkpoint saw."""
    vocab = payload["vocab"]
    if payload["train"]["shards"] != train_data.fingerprint or (vocab["src"], vocab["tgt"]) != (
        vocabs[0].model_proto,
        vocabs[1].model_proto,
    ):
        raise TrainError(
            f"{path} was trained on other data or another tokenizer than "
            f"{train_data.folder} (preprocess or tokenizer ran again since); "
            f"start over with --no-resume, or use another run_dir"
        )


def rng_state() -> dict:
    """The RNG streams training draws on (dropout); batching is seeded by (seed, epoch)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

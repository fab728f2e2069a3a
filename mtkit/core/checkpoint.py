"""Checkpoints: atomic save, safe load, keep-last-N, best, averaging (I/O).

A checkpoint is one self-contained file, a dict of plain values and tensors:

    format        "mtkit-checkpoint-1"
    config        the resolved `Config` as a plain dict
    vocab         {"src": bytes, "tgt": bytes}: the SentencePiece models
    model         the model's state_dict
    train         (training checkpoints) optimizer state, RNG states, step, epoch,
                  position in the epoch, best score, patience counter, elapsed time,
                  the fingerprint of the shards it was trained on, and the precision
                  the run trains in (decided at its first start, with the calibration);
                  under DDP, every rank's RNG states
    digest        SHA-256 over everything above (tensors by their bytes), checked on load

It is written to a temporary file, fsynced and renamed into place, and read with
`torch.load(weights_only=True)`: loading a checkpoint never runs code. Any file that is
not an intact mtkit checkpoint (truncated, a flipped byte, random bytes, NaN weights) is
one `CheckpointError`. `last.pt` and `best.pt` are copies of a `step_<N>.pt`, not hard
links, so that nothing written through one name can change another.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import mmap
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtkit.core.atomic import atomic_file, copy_atomic
from mtkit.core.config import Config, load_config
from mtkit.core.errors import UserError, plural

log = logging.getLogger(__name__)

FORMAT = "mtkit-checkpoint-1"
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(UserError, ValueError):
    """A missing, corrupt or foreign checkpoint (one line)."""


def payload_digest(
    payload: dict[str, Any], after: Callable[[torch.Tensor], None] | None = None
) -> str:
    """SHA-256 over a checkpoint's content: every key path, every tensor's dtype, shape
    and bytes, every other value's repr. The `format` and `digest` keys are left out.
    `after` is called on each tensor once it is hashed (`MappedFile.release`)."""
    h = hashlib.sha256()

    def walk(key: str, value: Any) -> None:
        h.update(key.encode("utf-8", "surrogatepass") + b"\0")
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
            if after is not None:
                after(value)
        elif isinstance(value, dict):
            h.update(f"dict{len(value)}".encode())
            for k in sorted(value, key=repr):
                walk(f"{key}/{k!r}", value[k])
        elif isinstance(value, (list, tuple)):
            h.update(f"{type(value).__name__}{len(value)}".encode())
            for i, v in enumerate(value):
                walk(f"{key}/{i}", v)
        elif isinstance(value, (bytes, bytearray)):
            h.update(bytes(value))
        else:
            h.update(repr(value).encode("utf-8", "surrogatepass"))

    for k in sorted(payload):
        if k not in ("format", "digest"):
            walk(k, payload[k])
    return h.hexdigest()


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Write atomically: temporary file in the same folder, fsync, `os.replace`."""
    body = {k: v for k, v in payload.items() if k not in ("format", "digest")}
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **body, "digest": payload_digest(body)}, f)


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint onto the CPU without executing code, and check it: the digest
    of its content, the shape of its parts, finite weights. One-line errors.

    `mmap`: the tensors stay in the file's pages (copy-on-write) instead of being read
    into the process's own memory; for reading only, as translation does. Checking
    reads every page, so each tensor's pages are handed back once checked
    (`MappedFile.release`): a training checkpoint's optimizer state is then never
    resident, and the weights are paged in again as they are used."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise CheckpointError(
            f"{path}: not a readable checkpoint (not a zip archive: "
            f"truncated, corrupt or not made by mtkit)"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # untrusted bytes: any failure to parse them means "corrupt"
        refused = "Weights only load failed" in str(e)
        why = (
            "it holds objects that safe loading refuses to build"
            if refused
            else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:100]}"
        )
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated, corrupt or not made by mtkit; {why})"
        ) from None
    found = payload.get("format") if isinstance(payload, dict) else None
    if isinstance(found, str) and found.startswith("mtkit-checkpoint-") and found != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {found}, which this mtkit does not read (it reads {FORMAT})"
        )
    if found != FORMAT:
        raise CheckpointError(f"{path}: not an mtkit checkpoint")
    _check_content(payload, path, MappedFile(path).release if mmap else None)
    return payload


class MappedFile:
    """The address ranges where this process maps a file (`/proc/self/maps`), and a
    way to hand back a memory-mapped tensor's pages: `madvise(MADV_DONTNEED)` on the
    whole pages of its storage. Only pages that lie inside the file's own private
    mappings are touched: those are re-read from the page cache at the next access, as
    nothing was written to them. Anywhere else (another allocation, no /proc, no libc)
    `release` does nothing, so it never discards memory that holds data."""

    MADV_DONTNEED = 4

    def __init__(self, path: Path):
        self.ranges: list[tuple[int, int]] = []
        try:
            target = str(path.resolve())
            for line in Path("/proc/self/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5] == target and fields[1][3] == "p":
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    self.ranges.append((start, end))
            self.madvise = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError, ValueError, IndexError):
            self.ranges = []
        self.page = mmap.PAGESIZE

    def release(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        first = -(-start // self.page) * self.page  # the whole pages inside the storage
        last = end // self.page * self.page
        if last > first and any(lo <= first and last <= hi for lo, hi in self.ranges):
            self.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), self.MADV_DONTNEED)


def _check_content(
    payload: dict[str, Any], path: Path, release: Callable[[torch.Tensor], None] | None = None
) -> None:
    """The digest, the parts and finite weights; `release` is called on each tensor once
    it is read."""
    digest = payload.get("digest")
    if not isinstance(digest, str):
        raise CheckpointError(
            f"{path}: not an mtkit checkpoint this mtkit reads (no digest: written by an "
            f"older mtkit)"
        )
    if digest != payload_digest(payload, release):
        raise CheckpointError(
            f"{path}: corrupt checkpoint (its content does not match the digest stored in it)"
        )
    model, vocab = payload.get("model"), payload.get("vocab")
    if not isinstance(model, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()
    ):
        raise CheckpointError(f"{path}: not an mtkit checkpoint (no model weights)")
    if (
        not isinstance(payload.get("config"), dict)
        or not isinstance(vocab, dict)
        or not all(isinstance(vocab.get(side), bytes) for side in ("src", "tgt"))
    ):
        raise CheckpointError(f"{path}: not an mtkit checkpoint (no config or vocabulary)")
    for name, t in model.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(
                f"{path}: the weights hold NaN or infinite values "
                f"({name}); this checkpoint cannot be used"
            )
        if release is not None:
            release(t)


def training_payload(
    config: dict,
    vocab: dict,
    model: dict,
    optimizer: dict,
    rng: dict,
    progress: dict,
    shards: str,
    precision: dict,
    shortlist: dict[str, torch.Tensor] | None = None,
    rng_of_ranks: list[dict] | None = None,
) -> dict[str, Any]:
    """The layout of a training checkpoint (see the module docstring); `shards` is the
    fingerprint of the shard manifest it was trained on, `precision` the run's precision
    record ({"precision": "fp32" | "bf16", "asked": train.precision, "calibration"?}),
    `vocab` the tokenizers' entry (`vocab.vocab_entry`), `shortlist` a distilled
    student's lexical shortlist (`mtkit.search.shortlist`), kept with the model. `rng`
    is rank 0's RNG streams; under DDP, `rng_of_ranks` holds those of ranks 1, 2, ...,
    so that a resumed run draws every rank's dropout where it stopped."""
    extra = {} if shortlist is None else {"shortlist": shortlist}
    ranks = {"rng_of_ranks": rng_of_ranks} if rng_of_ranks else {}
    return {
        **extra,
        "config": config,
        "vocab": vocab,
        "model": model,
        "train": {
            "optimizer": optimizer,
            "rng": rng,
            "progress": progress,
            "shards": shards,
            "precision": precision,
            **ranks,
        },
    }


def step_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """`step_<N>.pt` files in a folder, oldest first."""
    found = []
    for p in Path(folder).glob("step_*.pt"):
        m = _STEP_FILE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def last_step_checkpoints(folder: Path, n: int) -> list[Path]:
    """The newest `n` `step_<N>.pt` files of a folder, oldest first; an error if none."""
    paths = [p for _, p in step_checkpoints(folder)][-n:]
    if not paths:
        raise CheckpointError(f"{folder}: no step_<N>.pt checkpoints")
    return paths


def write_training_checkpoint(
    payload: dict[str, Any], folder: Path, step: int, is_best: bool, keep_last: int
) -> Path:
    """Save `step_<step>.pt`, copy it to `last.pt` (and `best.pt` if best), and delete
    step files beyond the newest `keep_last` (0 keeps only last.pt / best.pt).

    Copies, not hard links: a user's tool that writes into `last.pt` in place must not
    change `best.pt` and the step files with it."""
    folder = Path(folder)
    step_path = folder / f"step_{step}.pt"
    save_checkpoint(payload, step_path)
    copy_atomic(step_path, folder / "last.pt")
    if is_best:
        copy_atomic(step_path, folder / "best.pt")
    steps = step_checkpoints(folder)
    for _, old in steps[: max(len(steps) - keep_last, 0)]:
        old.unlink()
    return step_path


def find_resumable(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable training checkpoint: last.pt, else step files newest first.
    Unreadable ones are reported and skipped. None when there is none at all."""
    folder = Path(folder)
    candidates = [folder / "last.pt"] + [p for _, p in reversed(step_checkpoints(folder))]
    for path in candidates:
        if not path.exists():
            continue
        try:
            payload = load_checkpoint(path)
        except CheckpointError as e:
            log.warning("skipping %s", e)
            continue
        if "train" in payload:
            return path, payload
    return None


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of several checkpoints of one model.

    Returns an inference checkpoint (no training state) with the first one's config and
    vocabulary (and the target languages' pieces of the newest that has them)."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    steps = [trained_step(first)]
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    vocab = dict(first["vocab"])
    for path in paths[1:]:
        payload = load_checkpoint(path)
        model, steps = payload["model"], steps + [trained_step(payload)]
        if "tgt_languages" in payload["vocab"]:  # a checkpoint newer than the first's mtkit
            vocab["tgt_languages"] = payload["vocab"]["tgt_languages"]
        if model.keys() != total.keys() or any(model[k].shape != total[k].shape for k in total):
            raise CheckpointError(
                f"{path}: weights do not match {paths[0]}; "
                f"only checkpoints of one model can be averaged"
            )
        for k, v in model.items():
            if v.is_floating_point():
                total[k] += v.double()
    dtypes = {k: v.dtype for k, v in first["model"].items()}
    averaged = {
        k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in total.items()
    }
    extra = {"shortlist": first["shortlist"]} if "shortlist" in first else {}
    return {
        **extra,
        "config": first["config"],
        "vocab": vocab,
        "model": averaged,
        "averaged_from": [str(p) for p in paths],
        "averaged_steps": steps,
    }


def trained_step(payload: dict[str, Any]) -> int | None:
    """The training step a checkpoint was saved at (None: not a training checkpoint)."""
    step = payload.get("train", {}).get("progress", {}).get("step")
    return step if isinstance(step, int) else None


def describe_weights(payload: dict[str, Any]) -> str:
    """What a checkpoint's weights are, for people: "step 1000", "the average of steps
    800, 900 and 1000", "the average of 3 checkpoints" (averaged before mtkit recorded
    their steps), or "unknown"."""
    step = trained_step(payload)
    if step is not None:
        return f"step {step}"
    steps = payload.get("averaged_steps")
    if isinstance(steps, list) and steps and all(isinstance(x, int) for x in steps):
        listed = [str(x) for x in steps]
        return "the average of steps " + (
            ", ".join(listed[:-1]) + " and " + listed[-1] if len(listed) > 1 else listed[0]
        )
    sources = payload.get("averaged_from")
    if isinstance(sources, list) and sources:
        return f"the average of {plural(len(sources), 'checkpoint')}"
    return "unknown"


def newer(path: Path, than: Path) -> bool:
    """Whether `path` exists and was written no earlier than `than`."""
    return path.exists() and path.stat().st_mtime >= than.stat().st_mtime


def final_checkpoint(cfg: Config) -> Path:
    """The checkpoint the test set is translated with: the average of the last
    `train.average_last` checkpoints when set, else best.pt (last.pt without validation)."""
    folder = cfg.run_path / "checkpoints"
    last = folder / "last.pt"
    if cfg.train.average_last > 1:
        out = folder / "average.pt"
        if newer(out, last):
            return out
        steps = last_step_checkpoints(folder, cfg.train.average_last)
        log.info("averaging %d checkpoints: %s", len(steps), ", ".join(p.name for p in steps))
        save_checkpoint(average_checkpoints(steps), out)
        return out
    best = folder / "best.pt"
    return best if best.exists() else last


def trained_model(run: Path) -> Path | None:
    """A run directory's final model (`final_checkpoint`, averaged on the first ask), or
    None while the run has none: another stage's model named by its run (a teacher to
    distil, or to start a student from). Averaging writes average.pt there (atomically):
    a caller that must not race another writer holds the run's lock (`rundir.run_lock`)."""
    config = run / "config.yaml"
    if not (run / "checkpoints" / "last.pt").exists() or not config.exists():
        return None
    return final_checkpoint(dataclasses.replace(load_config(config), run_dir=str(run)))


SHORTLIST = Path("distill") / "shortlist.pt"  # in a run: a distilled student's shortlist
# A shortlist entry's (2,) source and target vocabulary sizes it was made for (`mtkit
# distill` records them; older shortlists lack them)
VOCAB_SIZES = "vocab_sizes"


def check_shortlist(entry: Any, src_size: int, tgt_size: int, origin: Path, remedy: str) -> None:
    """Refuse, in one `CheckpointError` naming `origin` and saying `remedy`, a lexical
    shortlist (`mtkit.search.shortlist`) that does not fit vocabularies of `src_size` and
    `tgt_size` pieces: it must hold "frequent" (F,) target ids and "table" (src_size, k)
    target ids padded with -1, every id within the target vocabulary, and its
    `VOCAB_SIZES` where it has them must be these. Searching with one that does not
    would index outside the model's output layer."""

    def refuse(why: str) -> None:
        raise CheckpointError(f"{origin}: unusable lexical shortlist ({why}); {remedy}")

    if not isinstance(entry, dict):
        refuse("not a dict of tensors")
    for key, dims in (("frequent", 1), ("table", 2)):
        t = entry.get(key)
        if not isinstance(t, torch.Tensor):
            refuse(f"no {key!r} tensor")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.dim() != dims:
            refuse(f"{key!r} is not a {dims}-d tensor of ids")
    sizes = entry.get(VOCAB_SIZES)
    if sizes is not None:
        made_for = sizes.tolist() if isinstance(sizes, torch.Tensor) else None
        if made_for != [src_size, tgt_size]:
            refuse(
                f"made for vocabularies of {made_for} pieces, "
                f"not this model's {src_size} and {tgt_size}"
            )
    frequent, table = entry["frequent"], entry["table"]
    if table.size(0) != src_size:
        refuse(f"its table has {table.size(0)} rows for {src_size} source pieces")
    for key, t, low in (("frequent", frequent, 0), ("table", table, -1)):
        if t.numel() and (int(t.min()) < low or int(t.max()) >= tgt_size):
            refuse(f"{key!r} holds ids outside the {tgt_size} target pieces")


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A dict of tensors, written atomically (read back with `load_tensors`)."""
    with atomic_file(path) as f:
        torch.save(tensors, f)


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A dict of tensors written by `save_tensors`, loaded without running code."""
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # untrusted bytes (UnpicklingError, BadZipFile, EOFError, ...)
        raise CheckpointError(
            f"{path}: unreadable (truncated or damaged: {type(e).__name__})"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(v, torch.Tensor) for v in tensors.values()
    ):
        raise CheckpointError(f"{path}: not a file of tensors")
    return tensors

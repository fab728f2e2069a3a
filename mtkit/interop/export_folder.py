"""The folder an export is written to, and the marker that makes it mtkit's.

Every export (CTranslate2's and Hugging Face's) holds `mtkit.json`, a manifest whose
`format` names what wrote it (`mtkit-ct2-1`, `mtkit-hf-1`) and whose `files` lists every
file the export holds. `--force` replaces a folder only when that marker says mtkit
wrote it and the folder holds nothing the manifest does not list: a folder's file
names prove nothing (an original Hugging Face Marian folder has an export's names, and
`--force` once overwrote one so). Anything else is refused in one line before anything
is written or removed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mtkit.core.checksum import file_sha256
from mtkit.engines.ct2 import EXPORT_FILES, FORMAT, MANIFEST, ExportError

HF_FORMAT = "mtkit-hf-1"
FORMATS = (FORMAT, HF_FORMAT)  # the marker's formats
# Every name a Hugging Face (Marian) export may hold. Names never make a folder mtkit's;
# a name outside these and the CTranslate2 export's says at once what is in the way.
HF_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "vocab.json",
        "target_vocab.json",
        "tokenizer_config.json",
    }
)


def export_target(
    output: str | os.PathLike, checkpoint: str | os.PathLike, force: bool = False
) -> Path:
    """The folder that exporting `checkpoint` to `-o output` may (re)place: `output` with
    its symbolic links resolved. Refused in one line: a file, `-`, the current folder or
    a folder above it, a folder that holds the checkpoint, and a non-empty folder unless
    `force` is given and it is a previous mtkit export (`not_an_export`)."""
    if str(output) == "-":
        raise ExportError("-o -: an export is a folder, not a stream; name a folder")
    target = Path(os.path.realpath(output))
    if target.exists() and not target.is_dir():
        raise ExportError(f"{output} is a file; -o must name a folder")
    here = Path(os.path.realpath(os.curdir))
    if target == here or target in here.parents:
        raise ExportError(
            f"-o {output} is the current folder or one above it, which "
            f"exporting would replace; name a new folder"
        )
    if target in Path(os.path.realpath(checkpoint)).parents:
        raise ExportError(f"{output} holds the checkpoint {checkpoint}; export to another folder")
    if not target.is_dir() or not any(target.iterdir()):
        return target
    if not force:
        raise ExportError(f"{output} exists and is not empty; add --force to replace it")
    why = not_an_export(target)
    if why is not None:
        raise ExportError(f"{output} {why}; --force replaces only a previous export")
    return target


def not_an_export(folder: Path) -> str | None:
    """Why `folder` is not a previous mtkit export that `--force` may replace (None: it
    is one): no readable marker, or something in it that the marker does not list."""
    marker = folder / MANIFEST
    manifest = None
    if marker.is_file() and not marker.is_symlink():
        try:
            manifest = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None
    kind = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(kind, str) or kind not in FORMATS:
        # Unmarked (an original Hugging Face folder has an export's very names), and
        # what in it no export could hold: a run directory's checkpoints, someone's notes.
        foreign = _foreign(folder, EXPORT_FILES | HF_FILES)
        return (
            f"is not an mtkit export (no {MANIFEST} naming an export format, the "
            f"marker every mtkit export holds{'; it ' + foreign if foreign else ''})"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        return f"has an {MANIFEST} without its list of files (an older mtkit's export)"
    return _foreign(folder, set(listed))


def _foreign(folder: Path, names: set[str] | frozenset[str]) -> str | None:
    """'holds X and N more, which an export does not' for what `folder` holds beyond the
    plain files `names` (and the marker); None where it holds nothing else."""
    foreign = sorted(
        (
            p.name
            for p in folder.iterdir()
            if p.name != MANIFEST and (p.name not in names or p.is_symlink() or not p.is_file())
        ),
        key=lambda name: (name.startswith("."), name),
    )
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        return f"holds {foreign[0]}{more}, which an export does not"
    return None


def manifest_files(folder: Path) -> dict[str, dict]:
    """The `files` entry of a manifest: every file of `folder`, its size and SHA-256."""
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.iterdir())
    }

"""Subword alignments of the training pairs, for guided alignment (`train.guided_alignment`).

eflomal (Östling and Tiedemann, 2016; `pip install 'mtkit[align]'`) aligns the binarized
training pairs once, at preprocess time, on their subword ids themselves (the pieces the
model reads and writes, so no word-to-subword mapping is needed), in both directions;
the links are symmetrized with grow-diag (the links both directions agree on, grown to
neighbours either direction found). They are stored beside the shard they align:

    RUN/data/train/align/links.bin   int16 (source position, target position) pairs
    RUN/data/train/align/links.idx   int64 offsets: pair i's links are [idx[i], idx[i+1])
    RUN/data/train/align/manifest.json  the pairs, the links, the shard's fingerprint

written atomically, and refused (one line) where the shard has changed since.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from mtkit.core.atomic import atomic_dir
from mtkit.data.shards import ShardDataset
from mtkit.data.sources import DataError

log = logging.getLogger(__name__)
FOLDER = "align"
NEIGHBOURS = ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def grow_diag(forward: set[tuple[int, int]], backward: set[tuple[int, int]]) -> set:
    """Koehn's grow-diag symmetrization: the links both directions agree on, then, until
    nothing changes, each link of either direction next to one already kept (also
    diagonally) whose source or target position is not yet linked."""
    union, kept = forward | backward, forward & backward
    grown = True
    while grown:
        grown = False
        for s, t in sorted(kept):
            for ds, dt in NEIGHBOURS:
                link = (s + ds, t + dt)
                if link in union and link not in kept:
                    sources, targets = {a for a, _ in kept}, {b for _, b in kept}
                    if link[0] not in sources or link[1] not in targets:
                        kept.add(link)
                        grown = True
    return kept


def _pharaoh(line: str) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in (x.split("-") for x in line.split())}


def align_ids(sources: list[np.ndarray], targets: list[np.ndarray]) -> list[set]:
    """eflomal's symmetrized links of each pair of id sequences."""
    return align_tokens(
        [" ".join(map(str, x)) for x in sources], [" ".join(map(str, y)) for y in targets]
    )


def align_tokens(sources: list[str], targets: list[str]) -> list[set[tuple[int, int]]]:
    """eflomal's links of each pair of whitespace-tokenized lines (source token, target
    token), symmetrized with `grow_diag`."""
    try:
        from eflomal import Aligner
    except ImportError:
        raise DataError(
            "train.guided_alignment aligns the training pairs with eflomal: "
            "pip install 'mtkit[align]'"
        ) from None
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        Aligner().align(
            sources, targets, links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True
        )
        forward = fwd.read_text().splitlines()
        backward = rev.read_text().splitlines()
    return [grow_diag(_pharaoh(f), _pharaoh(r)) for f, r in zip(forward, backward, strict=True)]


def align_shard(folder: Path) -> dict:
    """Align the pairs of the shard in `folder` and write `folder/align/` (atomically).
    Returns its manifest."""
    shard = ShardDataset(folder)
    start = time.perf_counter()
    pairs = [shard[i] for i in range(len(shard))]
    links = align_ids([np.asarray(x) for x, _ in pairs], [np.asarray(y) for _, y in pairs])
    flat = np.array([pos for pair in links for link in sorted(pair) for pos in link], np.int16)
    offsets = np.zeros(len(links) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in links])
    manifest = {
        "pairs": len(links),
        "links": int(offsets[-1]),
        "shard": shard.fingerprint,
        "aligner": "eflomal, grow-diag",
    }
    with atomic_dir(folder / FOLDER) as out:
        flat.tofile(out / "links.bin")
        offsets.tofile(out / "links.idx")
        (out / "manifest.json").write_text(json.dumps(manifest))
    log.info(
        "aligned %d training pairs (%d links) with eflomal in %.1fs",
        len(links),
        manifest["links"],
        time.perf_counter() - start,
    )
    return manifest


def aligned(folder: Path) -> bool:
    """Whether the shard in `folder` has alignments of its current pairs."""
    try:
        manifest = json.loads((folder / FOLDER / "manifest.json").read_text())
        return manifest["shard"] == ShardDataset(folder).fingerprint
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return False


class AlignedShards:
    """A `ShardDataset` whose pairs carry their links: (src ids, tgt ids, links (K, 2))."""

    def __init__(self, shard: ShardDataset):
        self.shard = shard
        folder = shard.folder / FOLDER
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            raise DataError(
                f"{folder}: no alignments of the training pairs (train.guided_alignment); "
                "run `mtkit preprocess`"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("shard") != shard.fingerprint:
            raise DataError(
                f"{folder}: the alignments are of other pairs than the shard's; "
                "run `mtkit preprocess`"
            )
        self.folder_links = folder
        self.offsets = np.fromfile(folder / "links.idx", dtype=np.int64)
        size = (folder / "links.bin").stat().st_size
        if len(self.offsets) != len(shard) + 1 or self.offsets[-1] * 4 != size:
            raise DataError(f"{folder}: the alignment files do not match; run `mtkit preprocess`")
        self._links: np.ndarray | None = None  # mapped when first read

    def __getattr__(self, name: str):  # lengths, manifest, directions...: the shard's
        if name in ("shard", "__setstate__") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.shard, name)

    def __getstate__(self) -> dict:  # a DataLoader worker maps the file itself
        return {**self.__dict__, "_links": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._links is None:
            path = self.folder_links / "links.bin"
            empty = not self.offsets[-1]  # (an empty file cannot be mapped)
            self._links = (
                np.zeros(0, np.int16) if empty else np.memmap(path, dtype=np.int16, mode="r")
            )
        x, y = self.shard[i]
        links = self._links[2 * self.offsets[i] : 2 * self.offsets[i + 1]].reshape(-1, 2)
        return x, y, links

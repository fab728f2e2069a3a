"""RUN/metrics.jsonl: one JSON object per training event, and its TensorBoard copy (I/O)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mtkit.core.atomic import write_failure


class MetricsLog:
    """RUN/metrics.jsonl: one JSON object per event (rank 0 only; `path` None elsewhere).
    With a TensorBoard `board` (a `SummaryWriter` on RUN/tensorboard/), the same training
    and validation figures also go to TensorBoard scalars (`train/loss`, `valid/bleu`,
    ...), at their step."""

    def __init__(self, path: Path | None, board=None):
        self.path = path
        self.board = board if path is not None else None

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        try:
            with open(self.path, "a", encoding="utf-8") as f:  # a log: appended in place
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise write_failure(e, self.path) or e from None
        if self.board is not None and event in ("train", "valid"):
            for key, value in fields.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    name = key.removeprefix("valid_") if event == "valid" else key
                    self.board.add_scalar(f"{event}/{name}", value, fields["step"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()

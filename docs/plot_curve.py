"""Draw a training curve from a run's metrics.jsonl: training loss and validation BLEU by step.

    python docs/plot_curve.py runs/multi30k/metrics.jsonl -o curve.png

Reads the `train` records (loss) and the `valid` records (valid_bleu, valid_loss) that
`mtkit train` writes, one JSON object per line, and draws them against the update step:
the training loss on a log scale on the left, the validation BLEU on the right. Needs
matplotlib (`pip install 'mtkit[viz]'`). The picture on the training page comes from
docs/assets/copy_metrics.jsonl, a 1,000-update run of configs/copy.yaml.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_metrics(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float, float]]]:
    """(step, loss) of each `train` record; (step, valid_loss, valid_bleu) of each `valid`."""
    train, valid = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("event") == "train":
            train.append((record["step"], record["loss"]))
        elif record.get("event") == "valid":
            valid.append((record["step"], record.get("valid_loss"), record.get("valid_bleu")))
    return train, valid


def plot(path: Path, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, valid = read_metrics(path)
    if not train:
        raise SystemExit(f"{path}: no `train` records")
    fig, left = plt.subplots(figsize=(7, 3.6), dpi=110)
    left.plot([s for s, _ in train], [v for _, v in train], color="tab:blue", label="training loss")
    valid_losses = [(s, v) for s, v, _ in valid if v is not None]
    if valid_losses:
        left.plot(
            [s for s, _ in valid_losses],
            [v for _, v in valid_losses],
            "o--",
            color="tab:cyan",
            label="validation loss",
        )
    left.set_yscale("log")
    left.set_xlabel("update step")
    left.set_ylabel("loss (log scale)")
    handles, labels = left.get_legend_handles_labels()
    bleus = [(s, b) for s, _, b in valid if b is not None]
    if bleus:
        right = left.twinx()
        right.plot(
            [s for s, _ in bleus],
            [b for _, b in bleus],
            "s-",
            color="tab:orange",
            label="validation BLEU",
        )
        right.set_ylabel("validation BLEU (greedy)")
        right.set_ylim(0, 105)
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    left.legend(handles, labels, loc="center right")
    left.set_title(title)
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("-o", "--out", type=Path, default=Path("training_curve.png"))
    parser.add_argument("--title", default="", help="the picture's title")
    args = parser.parse_args()
    plot(args.metrics, args.out, args.title or str(args.metrics))


if __name__ == "__main__":
    main()

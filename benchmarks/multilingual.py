"""The multilingual recipe against bilingual models: per-direction test2016 scores and
off-target rates, as a Markdown table (docs/multilingual.md).

    python benchmarks/multilingual.py RUN [--bilingual en-de=DIR en-fr=DIR ...]

RUN is a finished `mtkit run` of configs/multi30k-multilingual.yaml: its test.hyp (the
test directions one after another) and test.scores.json. Each bilingual DIR is a
finished `mtkit run` of one direction (configs/multi30k.yaml with that direction's
files). For every test direction the table gives the multilingual BLEU and chrF, the
bilingual BLEU where one is given and the difference, and the off-target rate: the share
of non-empty hypotheses that py3langid (`mtkit.core.langid`, among the run's languages) does
not detect as the target language, beside the same rate for the references (what the
identifier gets wrong on human translations). Zero-shot directions (not trained) are
marked. It also prints how many updates and how much training time each run took.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mtkit.core.config import load_config  # noqa: E402
from mtkit.core.langid import off_target  # noqa: E402
from mtkit.core.languages import directions, name  # noqa: E402
from mtkit.data.shards import ShardDataset  # noqa: E402


def training(run: Path) -> str:
    """ "N updates, M min" from the run's metrics.jsonl (wall time from its first start
    to its end, validations included)."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    starts = [r["time"] for r in records if r.get("event") == "start"]
    end = [r for r in records if r.get("event") == "end"]
    if not end or not starts:
        return "unfinished"
    return f"{end[-1]['step']} updates, {(end[-1]['time'] - starts[0]) / 60:.1f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--bilingual", nargs="*", default=[], help="DIRECTION=RUN_DIR")
    args = parser.parse_args()
    cfg = load_config(args.run / "config.yaml")
    trained = {name(d) for d in directions(cfg.data)}
    among = sorted({x for pair in directions(cfg.data) for x in pair})
    test = ShardDataset(args.run / "data" / "test")
    hyps = (args.run / "test.hyp").read_text("utf-8").split("\n")[:-1]
    refs = test.texts("tgt")
    scores = json.loads((args.run / "test.scores.json").read_text())["directions"]
    bilingual = {}
    for item in args.bilingual:
        direction, folder = item.split("=", 1)
        report = json.loads((Path(folder) / "test.scores.json").read_text())
        bilingual[direction] = (report["bleu"]["score"], training(Path(folder)))
    print(f"multilingual: {training(args.run)}")
    for direction, (_, spent) in bilingual.items():
        print(f"bilingual {direction}: {spent}")
    print(
        "\n| direction | multilingual BLEU | chrF | bilingual BLEU | difference | "
        "off-target | references off-target |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for direction, ix in test.directions().items():
        target = direction.split("-")[1]
        off = off_target([hyps[i] for i in ix], target, among)
        ref_off = off_target([refs[i] for i in ix], target, among)
        bleu = scores[direction]["bleu"]["score"]
        chrf = scores[direction]["chrf"]["score"]
        label = direction if direction in trained else f"{direction} (zero-shot)"
        if direction in bilingual:
            base = bilingual[direction][0]
            versus = f"{base:.2f} | {bleu - base:+.2f}"
        else:
            versus = "- | -"
        print(
            f"| {label} | {bleu:.2f} | {chrf:.2f} | {versus} | {off.rate:.1f}% | "
            f"{ref_off.rate:.1f}% |"
        )


if __name__ == "__main__":
    main()

"""The Python API against the command line on the same file: `mtkit.Translator` loaded once
and `translate` called on test2016, beside `mtkit translate -i test2016 -o OUT`.

    python benchmarks/api_speed.py -m runs/multi30k/checkpoints/average.pt [--beam 5]
        [--workers 0] [--rounds 2]

Both run with the same batches at once (`--workers`, 0: one per thread, as the command
line's default) and the checkpoint's other defaults. The command is timed whole (start,
load, translation, writing); the API's load and its `translate` are timed apart, and its
outputs are compared with the command's, line by line. Rounds alternate; the best of each
is kept. Prints one JSON line: sentences/s of each, their ratio, and identical lines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with gzip.open(DATA / "test2016.en.gz", "rt", encoding="utf-8") as f:
        lines = [x.rstrip("\n") for x in f]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "in.en").write_text("".join(x + "\n" for x in lines))
    cli_best = api_best = load_best = float("inf")
    cli_out: list[str] = []
    api_out: list[str] = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "mtkit", "-q", "translate", "-m", args.model, "-i",
             str(tmp / "in.en"), "-o", str(tmp / "out.de"), "--beam", str(args.beam),
             "--workers", str(args.workers)],
            check=True,
        )  # fmt: skip
        cli_best = min(cli_best, time.perf_counter() - start)
        cli_out = (tmp / "out.de").read_text().splitlines()
        code = (
            "import json, sys, time\n"
            "t0 = time.perf_counter()\n"
            "import mtkit\n"
            f"tr = mtkit.Translator.load({args.model!r}, workers={args.workers})\n"
            "t1 = time.perf_counter()\n"
            f"lines = open({str(tmp / 'in.en')!r}).read().splitlines()\n"
            f"out = [t.text for t in tr.translate(lines, beam={args.beam})]\n"
            "t2 = time.perf_counter()\n"
            "tr.close()\n"
            "print(json.dumps({'load': t1 - t0, 'translate': t2 - t1, 'out': out}))\n"
        )
        result = json.loads(
            subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            ).stdout
        )
        api_best = min(api_best, result["translate"])
        load_best = min(load_best, result["load"])
        api_out = result["out"]
    n = len(lines)
    print(
        json.dumps(
            {
                "sentences": n,
                "cli_sentences_per_s (whole command)": round(n / cli_best, 1),
                "api_sentences_per_s (translate only)": round(n / api_best, 1),
                "api_sentences_per_s (import + load + translate)": round(
                    n / (api_best + load_best), 1
                ),
                "api / cli (translate only vs whole command)": round(cli_best / api_best, 3),
                "identical_lines": f"{sum(a == b for a, b in zip(api_out, cli_out))}/{n}",
            }
        )
    )


if __name__ == "__main__":
    main()

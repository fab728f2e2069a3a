"""A distilled student against its teacher: BLEU, speed and memory through `mtkit translate`.

    python benchmarks/distill.py [--teacher runs/multi30k-best]
        [--student runs/multi30k-student [--student ...]]
        [--src data/multi30k/test2016.en.gz] [--ref data/multi30k/test2016.de.gz]
        [--repeat 3] [--rounds 2] [--workers 1,2] [--no-ct2] [--out distill.json]

Each model is a run directory's final model (the averaged checkpoint `mtkit run` used) or a
checkpoint file; several students (--student repeated) are measured in the same run, each
named by its run directory. Every configuration is a `mtkit translate` process of its own, with
beam 5 and greedy: the teacher in bf16 and int8 (its precision `auto` picks one of them),
the student in bf16 and int8, each with and without its lexical shortlist (--shortlist),
and the student exported to CTranslate2 int8 (`mtkit export --quantization int8`, skipped
with --no-ct2 or without the ct2 extra); each of them at every count of --workers
(batches at once on the CPU: helper processes for a checkpoint, CTranslate2's
inter_threads for an export), so that each side's best settings are among them.

Sentences/s counts translation only: each configuration translates the test set --repeat
times over (3,000 lines by default) and its first 20 lines alone, and the rate is the
difference in lines over the difference in wall time, so that starting Python, loading
the model and measuring precision cancel out. Configurations take turns for --rounds
rounds (medians), so that a slow spell of a shared machine falls on all of them. BLEU is
sacreBLEU's on the first copy of the test set, peak RSS the process's own (wait4). It
prints a table and one JSON line per configuration, then per student the ratios the issue
asks for: its best beam-5 speed and its best greedy speed over the teacher's best beam 5,
the BLEU each is below the teacher's best, and its native beam 5 over CTranslate2 int8
on the same weights. Name the CPU with the figures
(`lscpu`); the JSON holds it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_LINES = 20  # the short run whose wall time is the start-up's


def final_model(path: str) -> Path:
    """A checkpoint file as given; a run directory's averaged model, else best.pt."""
    p = Path(path)
    if p.is_file() or (p.is_dir() and (p / "mtkit.json").exists()):
        return p
    for name in ("average.pt", "best.pt", "last.pt"):
        if (p / "checkpoints" / name).exists():
            return p / "checkpoints" / name
    raise SystemExit(f"{path}: no checkpoint (train it: mtkit run)")


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def translate(model: Path, extra: list[str], source: Path, out: Path) -> tuple[float, int]:
    """`mtkit translate` of `source` into `out`: wall seconds and peak RSS in MB."""
    argv = [sys.executable, "-m", "mtkit", "-q", "translate", "-m", str(model)]
    argv += [*extra, "-i", str(source), "-o", str(out)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[3:])}: exit {proc.returncode}: {err.strip()[-500:]}")
    return wall, usage.ru_maxrss // 1024


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((x for x in text.splitlines() if x.startswith("flags")), "").split()
    return [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default="runs/multi30k-best")
    ap.add_argument("--student", action="append", help="default: runs/multi30k-student")
    ap.add_argument("--src", default="data/multi30k/test2016.en.gz")
    ap.add_argument("--ref", default="data/multi30k/test2016.de.gz")
    ap.add_argument("--repeat", type=int, default=3, help="copies of the test set per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--workers", default="1,2", help="translate --workers counts to measure (comma-separated)"
    )
    ap.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    ap.add_argument("--out", help="also write the JSON lines here")
    args = ap.parse_args()

    from mtkit.core.scoring import score

    teacher = final_model(args.teacher)
    students = {
        f"student:{Path(s).name}" if len(args.student or []) > 1 else "student": final_model(s)
        for s in args.student or ["runs/multi30k-student"]
    }
    sources, references = read_lines(args.src), read_lines(args.ref)
    work = Path(tempfile.mkdtemp(prefix="distill-bench-"))
    long_src, short_src = work / "long.txt", work / "short.txt"
    long_src.write_text("".join(f"{x}\n" for x in sources * args.repeat), encoding="utf-8")
    short_src.write_text("".join(f"{x}\n" for x in sources[:START_LINES]), encoding="utf-8")

    configs: list[tuple[str, Path, list[str]]] = []
    for search, beam in (("beam5", "5"), ("greedy", "1")):
        for precision in ("bf16", "int8"):
            configs.append((f"teacher {precision} {search}", teacher, [precision, beam]))
            for label, student in students.items():
                for shortlist in ("", " shortlist"):
                    name = f"{label} {precision}{shortlist} {search}"
                    configs.append((name, student, [precision, beam]))
    ct2 = {}
    if not args.no_ct2:
        try:
            import ctranslate2  # noqa: F401

            for label, student in students.items():
                ct2[label] = work / f"{label.replace(':', '-')}-ct2-int8"
                subprocess.run(
                    [sys.executable, "-m", "mtkit", "-q", "export", "-m", str(student)]
                    + ["--to", "ctranslate2", "-o", str(ct2[label]), "--quantization", "int8"],
                    check=True,
                )
                for search, beam in (("beam5", "5"), ("greedy", "1")):
                    name = f"{label} ctranslate2-int8 {search}"
                    configs.append((name, ct2[label], [None, beam]))
        except ImportError:
            print("distill: no ctranslate2 (pip install 'mtkit[ct2]'): left out", file=sys.stderr)
    counts = [int(x) for x in args.workers.split(",")]
    configs = [  # "... w2 beam5": the search stays last
        (f"{name.rsplit(' ', 1)[0]} w{w} {name.rsplit(' ', 1)[1]}", model, [*params, str(w)])
        for name, model, params in configs
        for w in counts
    ]

    def flags(name: str, precision: str | None, beam: str, workers: str) -> list[str]:
        out = ["--beam", beam, "--workers", workers]
        if precision:
            out += ["--precision", precision]
        if "shortlist" in name:
            out.append("--shortlist")
        elif name.startswith("student") and precision:
            out.append("--no-shortlist")
        return out

    runs: dict[str, dict] = {name: {"rates": [], "rss": []} for name, *_ in configs}
    for round_ in range(args.rounds):
        for name, model, (precision, beam, workers) in configs:
            extra = flags(name, precision, beam, workers)
            out = work / f"{name.replace(' ', '_').replace(':', '-')}.txt"
            long_wall, rss = translate(model, extra, long_src, out)
            short_wall, _ = translate(model, extra, short_src, work / "short.out")
            lines = len(sources) * args.repeat - START_LINES
            if long_wall <= short_wall:  # too few lines to outweigh the start-up's noise
                raise SystemExit(f"{name}: the long run took no longer than the short one: "
                                 f"raise --repeat")  # fmt: skip
            rate = lines / (long_wall - short_wall)
            runs[name]["rates"].append(rate)
            runs[name]["rss"].append(rss)
            if round_ == 0:
                hyps = out.read_text(encoding="utf-8").splitlines()[: len(sources)]
                runs[name]["bleu"] = score(hyps, references, ["bleu"])[0].score
            print(f"distill: round {round_ + 1} {name}: {rate:.1f} sentences/s", file=sys.stderr)

    cpu = {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count()}
    results = []
    print(f"{'configuration':<48} {'sent/s':>8} {'BLEU':>6} {'RSS MB':>7}")
    for name, *_ in configs:
        r = runs[name]
        row = {
            "name": name,
            "sentences_per_s": round(statistics.median(r["rates"]), 1),
            "bleu": round(r["bleu"], 2),
            "peak_rss_mb": max(r["rss"]),
            "rounds": args.rounds,
            **cpu,
        }
        results.append(row)
        print(
            f"{name:<48} {row['sentences_per_s']:>8.1f} {row['bleu']:>6.2f} "
            f"{row['peak_rss_mb']:>7d}"
        )

    def best(prefix: str, search: str, ctranslate2: bool = False) -> dict:
        """The fastest configuration of `prefix` and `search`, over precisions, shortlists
        and workers: the native engine's, or with `ctranslate2` CTranslate2's."""
        rows = [
            r
            for r in results
            if r["name"].startswith(prefix + " ")
            and r["name"].endswith(search)
            and ("ctranslate2" in r["name"]) == ctranslate2
        ]
        return max(rows, key=lambda r: r["sentences_per_s"])

    t = best("teacher", "beam5")
    teacher_bleu = max(r["bleu"] for r in results if r["name"].startswith("teacher"))
    for label in students:
        s, g = best(label, "beam5"), best(label, "greedy")
        summary = {
            "name": f"summary {label}",
            "teacher_best_beam5": t["name"],
            "student_best_beam5": s["name"],
            "speedup_beam5": round(s["sentences_per_s"] / t["sentences_per_s"], 2),
            "bleu_loss_beam5": round(teacher_bleu - s["bleu"], 2),
            "student_best_greedy": g["name"],
            "speedup_greedy_over_teacher_beam5": round(
                g["sentences_per_s"] / t["sentences_per_s"], 2
            ),
            "bleu_loss_greedy": round(teacher_bleu - g["bleu"], 2),
            **cpu,
        }
        if label in ct2:
            c = best(label, "beam5", ctranslate2=True)
            summary["ct2_best_beam5"] = c["name"]
            summary["student_over_ct2_int8_beam5"] = round(
                s["sentences_per_s"] / c["sentences_per_s"], 2
            )
        results.append(summary)
    text = "".join(json.dumps(r) + "\n" for r in results)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

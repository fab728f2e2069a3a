"""A/B check that a refactor keeps behaviour and speed: the same runs at two revisions.

    python benchmarks/ab_compare.py --base REV_A --head REV_B [--rounds 3] [--lines 1000]
        [--speed-lines 1000] [--train-steps 12] [--model CKPT] [--out ab.json]
        [--jobs translate_speed,train_throughput,translate_beam5,translate_beam1,train_loop]
        [--loop-steps 100] [--loop-config configs/multi30k.yaml]

What it runs. REV_A and REV_B are checked out into two temporary git worktrees of this
repository. Each round runs every job once at A, then once at B (A, B, A, B, ...), each in
its own process with PYTHONPATH and the working directory set to that side's worktree, so
that each side imports its own mtkit and runs its own copy of the benchmark scripts:

- translate_speed: benchmarks/translate_speed.py, greedy and beam 5 on the first
  --speed-lines lines of test2016 (sentences/s, target tokens/s, peak memory);
- train_throughput: benchmarks/train_throughput.py, --train-steps timed fp32 steps of the
  Multi30k model on synthetic 24x24 batches (tokens/s, peak memory, model TFLOP/s and a
  large matrix product's, for scale);
- translate_beam5, translate_beam1: `python -m mtkit translate -m CKPT --beam 5` (and 1)
  on the first --lines lines of test2016 (wall seconds, start-up included);
- train_loop (only when --jobs names it): the whole training loop, `python -m mtkit train`
  from scratch for --loop-steps fp32 updates on --loop-config (tokenizer and preprocess
  once per side, into its own run directory, not timed; the config's relative data paths
  read each worktree's own corpora). train_throughput times the model's step alone; this
  times what the trainer adds around it (sampling, batching, logging, checkpoints), and
  shows whether both revisions train the same model: with the same seed and fp32 (the
  same on every CPU) the logged losses must be equal.

--jobs picks the jobs (comma-separated; default: all but train_loop).

Every side translates with the same checkpoint: --model, or a tiny model (2 layers, 128
wide, one minute of training) that REV_A trains once and caches under --cache by REV_A's
commit. A checkpoint is data, so B must read what A wrote.

How to read it. The table gives each metric's median over the rounds at A and at B and the
ratio B/A. For rates (`_per_s`, `tflops`, `utilisation`) a ratio above 1 means B is
faster; for seconds (`wall_s`) and megabytes (`_mb`) it means B is slower or bigger.
`spread` is the larger of the two sides' (max - min) / median over the rounds: a ratio
within the spread is noise, not a change (the CPUs are shared; use 3 rounds or more).
Below the table, each translation (and train_loop's logged losses) is "identical" when
every round of both sides wrote the same bytes; otherwise it names the first line that
differs, A's text and B's. "unstable" means a side differed from itself between rounds:
nondeterminism, not the refactor.
A warning under the table says when the load average passed 1.5 times the CPUs during
the runs: someone else's work then shared the CPUs, and only the outputs' verdicts hold.
The JSON (--out) holds every run's figures and the load average as it started, both
revisions, the checkpoint and the CPU: its model name and the avx512f / avx512_bf16 / amx
flags, which pick the kernels and so the speed; compare figures only on the same CPU.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

from mtkit.core.checksum import file_sha256  # (the harness's own checkout; each side runs its own)

HERE = Path(__file__).resolve().parent
FLAGS = ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
IGNORED = {"sentences", "steps"}  # the scripts' echo of their inputs, not measurements
RUN_TIMEOUT = 1200  # seconds, any one process


class JobFailed(Exception):
    """A run that exited non-zero or printed no result; the message ends with its stderr."""


def log(message: str) -> None:
    print(f"ab_compare: {message}", file=sys.stderr, flush=True)


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def add_worktree(repo: Path, rev: str, path: Path) -> dict:
    sha = git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    git(repo, "worktree", "add", "--detach", str(path), sha)
    return {
        "rev": rev,
        "sha": sha,
        "path": str(path),
        "subject": git(repo, "log", "-1", "--format=%s", sha)[:120],
    }


def remove_worktrees(repo: Path, paths: list[str]) -> None:
    for path in paths:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", path], capture_output=True
        )
    subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def run_side(side: dict, argv: list[str]) -> tuple[float, str]:
    """Run `python ARGV` in the side's worktree with only its mtkit importable: (wall
    seconds, stdout). Raises JobFailed with the end of stderr if it fails."""
    env = {**os.environ, "PYTHONPATH": side["path"]}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=side["path"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise JobFailed(f"exit {proc.returncode}: {' '.join(argv[:3])} ...\n{tail}")
    return wall, proc.stdout


def check_import(side: dict) -> None:
    """Refuse to measure a side that would import some other mtkit."""
    _, out = run_side(side, ["-c", "import mtkit; print(mtkit.__file__)"])
    found = Path(out.strip()).resolve()
    if Path(side["path"]).resolve() not in found.parents:
        raise SystemExit(f"side {side['name']} imports {found}, not its worktree's mtkit")


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise JobFailed("no JSON line in its output")


def numbers(result: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in result.items()
        if k not in IGNORED and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def tiny_config(run: Path, data: Path) -> dict:
    """The tiny model's config: Multi30k with a 2,000-piece vocabulary, 2 layers of 128,
    one minute of fp32 training, validated once, on 200 pairs."""
    valid = {"src": str(run / "valid.en"), "tgt": str(run / "valid.de")}
    return {
        "run_dir": str(run),
        "data": {
            "src_lang": "en",
            "tgt_lang": "de",
            "valid": valid,
            "test": valid,
            "train": {"src": str(data / "train.en.gz"), "tgt": str(data / "train.de.gz")},
        },
        "tokenizer": {"model_type": "bpe", "vocab_size": 2000, "joint": True},
        "model": {
            "encoder_layers": 2,
            "decoder_layers": 2,
            "d_model": 128,
            "heads": 4,
            "ffn_dim": 512,
            "dropout": 0.1,
        },
        "train": {
            "max_tokens": 4096,
            "lr": 0.002,
            "warmup_steps": 100,
            "max_time": 60,
            "valid_every": 1000000,
            "patience": 0,
            "keep_last": 1,
            "precision": "fp32",
            "seed": 1,
        },
    }


def tiny_checkpoint(side: dict, data: Path, cache: Path) -> Path:
    """Train the tiny model with this side's mtkit, once per commit; its checkpoint."""
    import yaml  # mtkit's own dependency

    key = hashlib.sha256(
        (side["sha"] + json.dumps(tiny_config(Path(), data), sort_keys=True)).encode()
    ).hexdigest()[:16]
    ready = cache / key
    if (ready / "checkpoints" / "last.pt").exists():
        return ready / "checkpoints" / "last.pt"
    run = cache / f"{key}.partial-{os.getpid()}"
    run.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        (run / f"valid.{lang}").write_text(
            "".join(read_lines(data / f"val.{lang}.gz", 200)), encoding="utf-8"
        )
    config = run / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(run, data)), encoding="utf-8")
    log(f"training the tiny checkpoint at {side['name']} ({side['sha'][:10]}), about 2 min")
    try:
        for stage in ("tokenizer", "preprocess", "train"):
            run_side(side, ["-m", "mtkit", "-q", stage, "-c", str(config)])
    except JobFailed as e:
        shutil.rmtree(run, ignore_errors=True)
        raise SystemExit(f"training the tiny checkpoint failed: {e}") from None
    os.replace(run, ready)
    return ready / "checkpoints" / "last.pt"


def read_lines(path: Path, limit: int) -> list[str]:
    """The first `limit` lines of a text file, plain or .gz, each ending in a newline."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") + "\n" for _, line in zip(range(limit), f)]


def job_translate_speed(side: dict, ctx: dict, round_: int) -> dict:
    argv = [
        "benchmarks/translate_speed.py",
        "-m",
        ctx["model"],
        "--src",
        ctx["test_src"],
        "--limit",
        str(ctx["speed_lines"]),
    ]
    wall, out = run_side(side, argv)
    result = last_json(out)
    return numbers(result) | {"wall_s": wall, "raw": result}


def job_train_throughput(side: dict, ctx: dict, round_: int) -> dict:
    argv = [
        "benchmarks/train_throughput.py",
        "--config",
        "configs/multi30k.yaml",
        "--synthetic",
        "24",
        "24",
        "--precision",
        "fp32",
        "--steps",
        str(ctx["train_steps"]),
        "--warmup",
        "2",
    ]
    wall, out = run_side(side, argv)
    result = last_json(out)
    return numbers(result) | {"wall_s": wall, "raw": result}


def job_translate(beam: int):
    def job(side: dict, ctx: dict, round_: int) -> dict:
        out = Path(ctx["tmp"]) / "out" / f"{side['name']}-beam{beam}-round{round_}.txt"
        out.parent.mkdir(exist_ok=True)
        wall, _ = run_side(
            side,
            [
                "-m",
                "mtkit",
                "-q",
                "translate",
                "-m",
                ctx["model"],
                "-i",
                ctx["lines_file"],
                "-o",
                str(out),
                "--beam",
                str(beam),
            ],
        )
        return {"wall_s": wall, "output": str(out)}

    return job


def job_train_loop(side: dict, ctx: dict, round_: int) -> dict:
    """`mtkit train` from scratch for --loop-steps updates in the side's own run directory
    (its tokenizer and shards made at the first round): tokens/s and the logged losses."""
    run = Path(ctx["tmp"]) / f"loop-{side['name']}"
    steps = ctx["loop_steps"]
    sets = [
        *("--set", f"run_dir={run}"),
        *("--set", f"train.max_steps={steps}"),
        *("--set", "train.max_time=0"),
        *("--set", "train.precision=fp32"),
        *("--set", f"train.log_every={max(steps // 4, 1)}"),
        *("--set", f"train.valid_every={steps * 10}"),
    ]
    config = ctx["loop_config"]
    if not (run / "data").is_dir():
        for stage in ("tokenizer", "preprocess"):
            run_side(side, ["-m", "mtkit", "-q", stage, "-c", config, *sets])
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    (run / "metrics.jsonl").unlink(missing_ok=True)
    wall, _ = run_side(side, ["-m", "mtkit", "-q", "train", "-c", config, *sets])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    events = [e for e in map(json.loads, lines) if e.get("event") == "train"]
    if not events:
        raise JobFailed("no train event in metrics.jsonl")
    return {
        "tokens_per_s": float(events[-1]["tokens_per_s"]),
        "wall_s": wall,
        "losses": [e["loss"] for e in events],
    }


JOBS = {
    "translate_speed": job_translate_speed,
    "train_throughput": job_train_throughput,
    "translate_beam5": job_translate(5),
    "translate_beam1": job_translate(1),
    "train_loop": job_train_loop,
}
DEFAULT_JOBS = "translate_speed,train_throughput,translate_beam5,translate_beam1"


def run_rounds(sides: dict, ctx: dict, rounds: int, jobs: list[str]) -> dict:
    """runs[job][side]: one dict per round, its figures or {"error": why}."""
    runs: dict = {job: {name: [] for name in sides} for job in jobs}  # load: 1, 5, 15 min
    for r in range(rounds):
        for job, fn in ((j, JOBS[j]) for j in jobs):
            for name, side in sides.items():
                log(f"round {r + 1}/{rounds}: {job} at {name}")
                load = list(os.getloadavg())  # a list: not a figure to summarize
                try:
                    result = fn(side, ctx, r)
                except (JobFailed, subprocess.TimeoutExpired) as e:
                    log(f"{job} at {name} failed: {e}")
                    result = {"error": str(e)}
                runs[job][name].append(result | {"load_average": load})
    return runs


def summarize(runs: dict) -> dict:
    """{job.metric: medians, ratio and spread} for every figure both sides produced."""
    summary = {}
    for job, by_side in runs.items():
        ok = {name: [r for r in rs if "error" not in r] for name, rs in by_side.items()}
        keys = sorted(
            {k for rs in ok.values() for r in rs for k, v in r.items() if isinstance(v, float)}
        )
        for key in keys:
            values = {name: [r[key] for r in rs if key in r] for name, rs in ok.items()}
            row = {name: statistics.median(v) if v else None for name, v in values.items()}
            row["ratio"] = row["B"] / row["A"] if row["A"] and row["B"] is not None else None
            row["spread"] = max(
                (
                    (max(v) - min(v)) / abs(statistics.median(v))
                    for v in values.values()
                    if v and statistics.median(v)
                ),
                default=0.0,
            )
            summary[f"{job}.{key}"] = row
    return summary


def first_difference(a: bytes, b: bytes) -> dict:
    """The first line (from 1) where A's and B's bytes differ, and both texts (None past
    the end of a file)."""
    for number, (x, y) in enumerate(zip_longest(a.split(b"\n"), b.split(b"\n")), 1):
        if x != y:
            return {
                "line": number,
                "A": shown_line(x),
                "B": shown_line(y),
                "lines_A": a.count(b"\n"),
                "lines_B": b.count(b"\n"),
            }
    return {}


def shown_line(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")[:300]


def written(result: dict) -> bytes | None:
    """What a run wrote that both sides must write alike: a translation's bytes, or the
    training's logged losses, one a line."""
    if "output" in result:
        return Path(result["output"]).read_bytes()
    if "losses" in result:
        return "".join(f"{loss!r}\n" for loss in result["losses"]).encode()
    return None


def compare_outputs(runs: dict) -> dict:
    """Per translate job (and train_loop's losses): identical across all rounds and sides,
    or the first difference."""
    report = {}
    for job in (j for j in runs if j.startswith("translate_beam") or j == "train_loop"):
        outs = {
            name: [w for w in map(written, rs) if w is not None] for name, rs in runs[job].items()
        }
        if not outs["A"] or not outs["B"]:
            report[job] = {"status": "not compared (a side failed)"}
            continue
        unstable = [name for name, o in outs.items() if len(set(o)) > 1]
        same = outs["A"][0] == outs["B"][0]
        report[job] = {
            "status": (
                "identical" if same and not unstable else "differs" if not same else "unstable"
            ),
            "unstable_sides": unstable,
            "sha256": {
                n: sorted({hashlib.sha256(x).hexdigest()[:16] for x in o}) for n, o in outs.items()
            },
        }
        if not same:
            report[job]["first_difference"] = first_difference(outs["A"][0], outs["B"][0])
    return report


def cpu_info() -> dict:
    """lscpu's model name and the flags that decide the kernels."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return {
        "model_name": fields.get("Model name", "").strip() or "unknown",
        "cpus": os.cpu_count(),
        "flags": {f: f in flags for f in FLAGS},
        "amx": any(f.startswith("amx") for f in flags),
    }


def fmt(value: float | None, digits: int = 4, missing: str = "failed") -> str:
    return missing if value is None else f"{value:.{digits}g}"


def table(report: dict) -> str:
    """The figures' table, then the translations' verdicts, the revisions and the CPU."""
    summary, outputs, cpu = report["summary"], report["outputs"], report["cpu"]
    rows = [("metric", "A median", "B median", "B/A", "spread")]
    rows += [
        (name, fmt(s["A"]), fmt(s["B"]), fmt(s["ratio"], 3, "-"), f"{s['spread']:.0%}")
        for name, s in summary.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for job, result in outputs.items():
        line = f"{job} output: {result['status']}"
        if "first_difference" in result:
            d = result["first_difference"]
            line += f" at line {d['line']}\n  A: {d['A']!r}\n  B: {d['B']!r}"
        if result.get("unstable_sides"):
            line += f" (side {', '.join(result['unstable_sides'])} differs between rounds)"
        lines.append(line)
    for job, by_side in report["runs"].items():
        for name, rs in by_side.items():
            errors = [r["error"] for r in rs if "error" in r]
            if errors:
                first = errors[0].splitlines()[-1][:160]
                lines.append(f"{job} at {name}: {len(errors)} of {len(rs)} runs failed: {first}")
    for name, side in report["sides"].items():
        lines.append(f"{name} = {side['sha'][:10]} ({side['rev']}) {side['subject'][:70]}")
    flags = ", ".join(f"{f} {'yes' if on else 'no'}" for f, on in cpu["flags"].items())
    lines.append(f"CPU: {cpu['model_name']}, {cpu['cpus']} CPUs; {flags}")
    lines.append(f"{report['rounds']} round(s); checkpoint {report['model']}")
    busiest = max(
        r["load_average"][0] for rs in report["runs"].values() for side in rs.values() for r in side
    )
    if busiest > 1.5 * (cpu["cpus"] or 1):
        lines.append(
            f"warning: load average up to {busiest:.1f} on {cpu['cpus']} CPUs during "
            "the runs: other work shared the CPUs, the timings are not reliable"
        )
    return "\n".join(lines)


def measure(args, sides: dict, tmp: Path) -> dict:
    """The checkpoint, the inputs, the interleaved rounds and their summary."""
    data = Path(args.data).resolve()
    if args.model:
        model = Path(args.model).resolve()
    elif any(job.startswith("translate") for job in args.jobs):
        model = tiny_checkpoint(sides["A"], data, Path(args.cache).expanduser())
    else:
        model = None  # train_loop alone translates nothing
    lines_file = tmp / "source.en"
    lines_file.write_text(
        "".join(read_lines(data / "test2016.en.gz", args.lines)), encoding="utf-8"
    )
    ctx = {
        "model": str(model),
        "test_src": str(data / "test2016.en.gz"),
        "tmp": str(tmp),
        "lines_file": str(lines_file),
        "speed_lines": args.speed_lines,
        "train_steps": args.train_steps,
        "loop_steps": args.loop_steps,
        "loop_config": str((HERE.parent / args.loop_config).resolve()),
    }
    load_before = os.getloadavg()
    runs = run_rounds(sides, ctx, args.rounds, args.jobs)
    return {
        "model": str(model),
        "model_sha256": file_sha256(model) if model else None,
        "lines": args.lines,
        "speed_lines": args.speed_lines,
        "rounds": args.rounds,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "summary": summarize(runs),
        "outputs": compare_outputs(runs),
        "runs": runs,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="revision A (the reference)")
    parser.add_argument("--head", required=True, help="revision B (the change)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--lines",
        type=int,
        default=1000,
        help="test2016 lines translated and compared per side and round",
    )
    parser.add_argument("--speed-lines", type=int, default=1000, help="translate_speed.py --limit")
    parser.add_argument("--train-steps", type=int, default=12, help="train_throughput.py --steps")
    parser.add_argument(
        "--jobs",
        type=lambda s: [j for j in s.split(",") if j],
        default=DEFAULT_JOBS.split(","),
        help=f"comma-separated, of {', '.join(JOBS)} (default: {DEFAULT_JOBS})",
    )
    parser.add_argument("--loop-steps", type=int, default=100, help="train_loop's updates")
    parser.add_argument(
        "--loop-config", default="configs/multi30k.yaml", help="train_loop's config"
    )
    parser.add_argument("--model", help="checkpoint both sides use (default: a tiny one)")
    parser.add_argument(
        "--data",
        default=str(HERE.parent / "data" / "multi30k"),
        help="folder with Multi30k's {train,val,test2016}.{en,de}.gz",
    )
    parser.add_argument("--cache", default="~/.cache/mtkit-ab", help="tiny checkpoints")
    parser.add_argument("--out", help="write the JSON report here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown:
        raise SystemExit(f"--jobs: no job {', '.join(unknown)}; the jobs: {', '.join(JOBS)}")
    repo = Path(git(HERE, "rev-parse", "--show-toplevel"))
    cpu = cpu_info()
    with tempfile.TemporaryDirectory(prefix="mtkit-ab-") as name:
        tmp, sides = Path(name), {}
        try:
            for side, rev in (("A", args.base), ("B", args.head)):
                sides[side] = add_worktree(repo, rev, tmp / side) | {"name": side}
                check_import(sides[side])
            log(f"A = {sides['A']['sha'][:10]} {sides['A']['subject'][:60]}")
            log(f"B = {sides['B']['sha'][:10]} {sides['B']['subject'][:60]}")
            report = {"sides": sides, "cpu": cpu, **measure(args, sides, tmp)}
        finally:
            remove_worktrees(repo, [s["path"] for s in sides.values()])
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()

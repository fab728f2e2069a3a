"""Soak: `mtkit translate --workers 2` with its helper killed (SIGKILL) at a random moment.

Issue 69's goal: every run ends within 10 s of the kill with one line on stderr naming
the helper and its exit code, exit code 2, and no output file, temporary or process
left; 200 runs with forked helpers (one thread each) and 50 with spawned ones (two
threads each: they load the model again). Each run kills the command's helper from
outside at a moment drawn uniformly in the first 80% of an undisturbed run from the
helper's start (measured first, per mode): while it starts, loads, takes a batch,
translates, or writes a result. A kill that lands after the translation has ended may
let the command finish: that run counts as "finished first" when its output is whole.

    python benchmarks/worker_soak.py                          # 200 + 50 runs
    python benchmarks/worker_soak.py --forked 20 --spawned 5  # a quick check
    python benchmarks/worker_soak.py --model m.pt --input in.txt

Without --model, a tiny model is trained first (20 steps on 2,000 Multi30k pairs, about
30 s); without --input, Multi30k's training source is the input. The first --lines lines
(--spawned-lines in the spawned runs) are translated with beam 4, 4-best and
alignments: large results, so that kills land half-way through writing one too. The
work folder is removed afterwards unless --work is given. "not killed": the helper had
ended before its kill (the command was ending). The summary's last columns: seconds
from the kill to the command's end.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtkit.core.faults import ENV as FAULTS_ENV

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "multi30k"
MARK = "MTKIT_SOAK_MARK"
END_S = 10.0  # a run must end this soon after its helper is killed
HANG_S = 120.0  # a run still going this long after its start hangs (it is killed)
LEFT_S = 5.0  # grace for processes to go after the command ended (the resource tracker)
# `python -m mtkit` with torch's threads set first: with --workers 2, one thread each
# forks the helper, two spawn it
RUN = (
    "import runpy, sys, torch; torch.set_num_threads(int(sys.argv.pop(1)));"
    " runpy.run_module('mtkit', run_name='__main__', alter_sys=True)"
)
THREADS = {"forked": 2, "spawned": 4}
NBEST = 4  # output lines per input line
WINDOW = 0.8  # kills are drawn in this share of the undisturbed run after the helper's start


def tiny_run(folder: Path) -> None:
    """A 2,000-pair corpus slice, a tiny config (1 layer of 16, fp32 on the CPU) and a run
    trained for 20 steps by `mtkit` itself, in `folder`."""
    for split, name, n in (
        ("train", "train", 2000),
        ("valid", "val", 100),
        ("test", "test2016", 100),
    ):
        for lang in ("en", "de"):
            with gzip.open(DATA / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                (folder / f"{split}.{lang}").write_text("".join(next(f) for _ in range(n)))
    config = {
        "run_dir": "run",
        "data": {
            **{s: {"src": f"{s}.en", "tgt": f"{s}.de"} for s in ("train", "valid", "test")},
            "workers": 1,
        },
        "tokenizer": {"vocab_size": 500},
        "model": {
            "encoder_layers": 1,
            "decoder_layers": 1,
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 32,
            "dropout": 0.0,
        },
        "train": {
            "max_tokens": 512,
            "warmup_steps": 10,
            "lr": 0.005,
            "max_steps": 20,
            "valid_every": 10,
            "device": "cpu",
            "precision": "fp32",
        },
    }
    (folder / "exp.yaml").write_text(yaml.safe_dump(config))
    for stage in ("tokenizer", "preprocess", "train"):
        done = subprocess.run(
            [sys.executable, "-m", "mtkit", stage, "-c", "exp.yaml"],
            cwd=folder,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"mtkit {stage} failed: {done.stderr[-2000:]}")


def prepare(folder: Path, lines: int) -> tuple[Path, Path]:
    """A tiny trained model (`tiny_run`: 20 steps on 2,000 Multi30k pairs) and an input
    of `lines` lines, in `folder`."""
    tiny_run(folder)
    source = folder / "in.txt"
    with gzip.open(DATA / "train.en.gz", "rt", encoding="utf-8") as f:
        source.write_text("".join(next(f) for _ in range(lines)))
    return folder / "run" / "checkpoints" / "last.pt", source


@dataclass
class Run:
    """What one command did."""

    code: int | None  # None: it hung (killed after HANG_S)
    stderr: str
    helper_at: float | None  # seconds from the start until its helper was seen
    killed_at: float | None  # seconds from the start until the helper was killed
    ended_at: float  # seconds from the start until the command ended
    output: int | None  # the output file's lines (None: no output file)
    leftovers: list[str] = field(default_factory=list)  # temporaries beside the output
    left: list[int] = field(default_factory=list)  # processes left


def helpers(pid: int, mode: str) -> list[int]:
    """The helpers among the direct children of `pid`: any child where they are forked;
    where they are spawned, those running multiprocessing's spawned main (not its
    resource tracker, a child too, whose fork looks the same until it has exec'd)."""
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            try:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                continue
            if mode == "forked" or b"--multiprocessing-fork" in cmdline:
                found.append(kid)
    return found


def marked(mark: str) -> list[int]:
    """The processes that carry `mark` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{MARK}={mark}".encode() in environ:
            found.append(int(entry.name))
    return found


def run_once(model: Path, source: Path, out: Path, mode: str, kill_after: float | None) -> Run:
    """One command; its helper killed `kill_after` seconds after it is first seen (None:
    not killed)."""
    mark = os.urandom(8).hex()
    env = {**os.environ, MARK: mark, "MTKIT_CACHE_DIR": ""}
    env.pop(FAULTS_ENV, None)  # a fault asked of the helpers (`mtkit.core.faults`): none
    args = ["-q", "translate", "-m", model, "-i", source, "-o", out, "--workers", 2]
    args += ["--beam", 4, "--nbest", NBEST, "--alignments", "--batch-tokens", 200]
    args += ["--max-len-a", 0, "--max-len-b", 20]
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(THREADS[mode]), *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    helper_at = killed_at = None
    helper = None
    while proc.poll() is None and time.monotonic() - start < HANG_S:
        now = time.monotonic() - start
        if helper is None:
            kids = helpers(proc.pid, mode)
            if kids:
                helper, helper_at = kids[0], now
        elif kill_after is not None and killed_at is None and now >= helper_at + kill_after:
            try:
                os.kill(helper, signal.SIGKILL)
                killed_at = now
            except ProcessLookupError:  # it had ended (the command is ending)
                killed_at = None
                kill_after = None
        time.sleep(0.005)
    code = proc.poll()
    if code is None:  # hung: end it, and whatever it started
        for pid in [proc.pid, *marked(mark)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    ended_at = time.monotonic() - start
    deadline = time.monotonic() + LEFT_S
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # (told in the summary; not left for the next run)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leftovers = [p.name for p in out.parent.glob(f".{out.name}.*")]
    output = len(out.read_bytes().splitlines()) if out.exists() else None
    result = Run(code, stderr, helper_at, killed_at, ended_at, output, leftovers, left)
    for path in [out, *out.parent.glob(f".{out.name}.*")]:
        path.unlink(missing_ok=True)
    return result


def verdict(run: Run, lines: int) -> str:
    """ "ok", "finished first", or what went wrong."""
    problems = []
    if run.code is None:
        problems.append(f"hung (killed after {HANG_S:.0f} s)")
    if run.left:
        problems.append(f"processes left: {run.left}")
    if run.leftovers:
        problems.append(f"temporaries left: {run.leftovers}")
    if run.code == 0 and run.killed_at is not None and not problems:
        whole = run.output == lines * NBEST
        return "finished first" if whole else f"exit 0 with {run.output} lines of {lines * NBEST}"
    if run.killed_at is None and run.code == 0 and not problems:
        return "not killed"  # the helper had ended before the kill
    err = run.stderr.strip().splitlines()
    if run.code not in (None, 2):
        problems.append(f"exit code {run.code}")
    if len(err) != 1 or "Traceback" in run.stderr:
        problems.append(f"{len(err)} stderr lines")
    elif "translation helper process" not in err[0] or "exit code" not in err[0]:
        problems.append(f"says {err[0]!r}")
    if run.output is not None:
        problems.append("output written")
    if run.killed_at is not None and run.ended_at - run.killed_at > END_S:
        problems.append(f"ended {run.ended_at - run.killed_at:.1f} s after the kill")
    return "; ".join(problems) or "ok"


def soak(
    model: Path, source: Path, work: Path, mode: str, runs: int, lines: int, rng: random.Random
):
    """`runs` killed commands in `mode` translating the first `lines` lines of `source`;
    their verdicts and seconds from kill to end."""
    out = work / "out.txt"
    text = source.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
    lines, source = len(text), work / f"in.{mode}.txt"
    source.write_text("".join(text), encoding="utf-8")
    calm = run_once(model, source, out, mode, None)
    if calm.code != 0 or calm.helper_at is None:
        sys.exit(f"the undisturbed {mode} run failed (exit {calm.code}): {calm.stderr.strip()}")
    window = WINDOW * (calm.ended_at - calm.helper_at)
    print(
        f"{mode}: undisturbed run {calm.ended_at:.1f} s, helper seen after "
        f"{calm.helper_at:.1f} s; kills drawn in [0, {window:.1f}] s after it",
        flush=True,
    )
    verdicts, delays = [], []
    for i in range(runs):
        run = run_once(model, source, out, mode, rng.uniform(0, window))
        said = verdict(run, lines)
        verdicts.append(said)
        if run.killed_at is not None and run.code is not None:
            delays.append(run.ended_at - run.killed_at)
        if said not in ("ok", "finished first", "not killed"):
            print(f"  {mode} run {i + 1}: {said} | {run.stderr.strip()[-300:]}", flush=True)
    return verdicts, delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forked", type=int, default=200, help="runs with forked helpers")
    parser.add_argument("--spawned", type=int, default=50, help="runs with spawned helpers")
    parser.add_argument("--model", type=Path, help="a checkpoint (default: a tiny one)")
    parser.add_argument("--input", type=Path, help="the text to translate")
    parser.add_argument("--lines", type=int, default=100, help="input lines translated")
    parser.add_argument(
        "--spawned-lines",
        type=int,
        default=25,
        help="input lines the spawned runs translate (each process on two threads: on "
        "fewer than 4 cores they crowd each other, ten times slower)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="a folder to keep (default: a temporary)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="worker_soak.") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model, source = args.model, args.input
        if model is None or source is None:
            made_model, made_source = prepare(work, max(args.lines, args.spawned_lines))
            model, source = model or made_model, source or made_source
        rows = []
        for mode, runs, lines in (
            ("forked", args.forked, args.lines),
            ("spawned", args.spawned, args.spawned_lines),
        ):
            if runs:
                verdicts, delays = soak(
                    model.resolve(), source.resolve(), work, mode, runs, lines, rng
                )
                rows.append((mode, verdicts, delays))
    print()
    print(
        f"{'helpers':<8} {'runs':>5} {'ok':>5} {'finished first':>15} {'not killed':>11} "
        f"{'failed':>7} {'kill->end s: median':>20} {'p95':>6} {'max':>6}"
    )
    failed = 0
    for mode, verdicts, delays in rows:
        bad = sum(v not in ("ok", "finished first", "not killed") for v in verdicts)
        failed += bad
        q = sorted(delays)
        p95 = q[min(len(q) - 1, int(0.95 * len(q)))] if q else float("nan")
        print(
            f"{mode:<8} {len(verdicts):>5} {verdicts.count('ok'):>5} "
            f"{verdicts.count('finished first'):>15} {verdicts.count('not killed'):>11} "
            f"{bad:>7} {statistics.median(q) if q else float('nan'):>20.2f} {p95:>6.2f} "
            f"{max(q) if q else float('nan'):>6.2f}"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

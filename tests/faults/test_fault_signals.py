"""A stop signal sent to the whole process group of `mtkit train` / `mtkit run`, as
Ctrl-C, `kill -TERM -- -PGID`, `timeout`, systemd and cluster schedulers send it: the
DataLoader workers ignore it, the trainer saves a checkpoint at the step it reached and
exits 130/143, and a resume ends with the weights of a run that never stopped.

The signal comes at a chosen moment (during set-up, a step, a validation, a checkpoint
save): the trainer runs in a new session (`start_new_session`, so it leads its own group,
as a shell job does) under a small driver that wraps one of mtkit's functions to send the
signal to the group (`kill -- -PGID` from another process) the first time it is called,
then lets it go on.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from mtkit.core.checkpoint import load_checkpoint
from mtkit.core.config import config_from_dict
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer

from conftest import read_lines, tiny_config_dict
from faultkit import ROOT

STEPS, VALID_EVERY = 12, 6

# Each moment: the module and the function whose first call (or, for a step, the call
# that makes step 4) sends the signal to the group, and the step the stop saves.
MOMENTS = {
    "lock": ("mtkit.training.loop", "remove_leftovers", 0),  # the run's lock just taken
    "setup": ("mtkit.training.state", "_open_metrics", 0),
    "step": ("mtkit.training.loop", "apply_update", 4),
    "validation": ("mtkit.training.loop", "greedy_search", VALID_EVERY),
    "save": ("mtkit.training.loop", "write_training_checkpoint", VALID_EVERY),
}

_DRIVER = """
import importlib, os, runpy, signal, subprocess, sys
prelude, module, name, sig, skip = sys.argv[1:5] + [int(sys.argv[5])]
exec(prelude)
target = importlib.import_module(module)
*owners, name = name.split(".")
for owner in owners:
    target = getattr(target, owner)
original = getattr(target, name)
calls = 0
def signalled(*args, **kwargs):
    global calls
    calls += 1
    if calls == skip + 1:  # from another process, as `kill` sends it (a DataLoader
        # worker obeys a SIGTERM from its parent whatever it ignores)
        subprocess.run([sys.executable, "-c", "import os, signal, sys; "
                        "os.killpg(int(sys.argv[1]), getattr(signal, sys.argv[2]))",
                        str(os.getpgrp()), sig], start_new_session=True)
    return original(*args, **kwargs)
setattr(target, name, signalled)
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a foreground command
sys.argv = ["mtkit", *sys.argv[6:]]
runpy.run_module("mtkit", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("signals") / "run"
    cfg = config_from_dict(tiny_config_dict(corpus, run))
    build_tokenizer(cfg)
    preprocess(cfg)
    return run


def _config(prepared, folder, corpus, loader_workers: int):
    run = folder / "run"
    shutil.copytree(prepared, run)
    data = tiny_config_dict(
        corpus,
        run,
        data={"loader_workers": loader_workers},
        model={"dropout": 0.1},
        train={"max_steps": STEPS, "valid_every": VALID_EVERY},
    )
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, run


def _weights(run):
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


@pytest.fixture(scope="module")
def straight(prepared, corpus, tmp_path_factory):
    """The weights of a run that never stopped."""
    config, run = _config(prepared, tmp_path_factory.mktemp("straight"), corpus, 0)
    done = subprocess.run(
        [sys.executable, "-m", "mtkit", "train", "-c", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return _weights(run)


def _signalled(args, module, name, sig, skip, prelude="") -> subprocess.CompletedProcess:
    """`mtkit ARGS` in a new process group; the group gets `sig` at `name`'s call number
    `skip + 1`. `prelude`: Python run first (to make a small job look big)."""
    return subprocess.run(
        [sys.executable, "-c", _DRIVER, prelude, module, name, sig, str(skip), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        start_new_session=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "moment, loader_workers, sig",
    [
        ("setup", 1, "SIGTERM"),
        ("step", 1, "SIGTERM"),
        ("validation", 1, "SIGTERM"),
        ("save", 1, "SIGTERM"),
        ("step", 2, "SIGTERM"),
        ("validation", 2, "SIGTERM"),
        ("step", 2, "SIGINT"),
        *[
            pytest.param(*row, marks=pytest.mark.slow)
            for row in (
                ("lock", 1, "SIGTERM"),
                ("save", 2, "SIGTERM"),
                ("validation", 1, "SIGINT"),
                ("setup", 2, "SIGINT"),
            )
        ],
    ],
)
def test_a_signal_to_the_group_saves_the_step_reached_and_resumes_exactly(
    prepared, corpus, tmp_path, straight, moment, loader_workers, sig
):
    config, run = _config(prepared, tmp_path, corpus, loader_workers)
    module, name, step = MOMENTS[moment]
    skip = step - 1 if moment == "step" else 0
    stopped = _signalled(["train", "-c", config], module, name, sig, skip)
    code = 128 + getattr(signal, sig)
    assert stopped.returncode == code, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "DataLoader worker" not in stopped.stderr
    if moment == "lock":  # before the trainer's handler: the command's own word
        assert stopped.stderr.strip() == ("interrupted" if sig == "SIGINT" else "terminated")
    else:
        assert stopped.stderr.count(f"{sig} received") == 1, stopped.stderr  # the trainer's
    checkpoints = run / "checkpoints"
    if step == 0:  # nothing trained yet: nothing to save
        assert not list(checkpoints.glob("*.pt")) if checkpoints.exists() else True
    else:
        saved = load_checkpoint(checkpoints / "last.pt")
        assert saved["train"]["progress"]["step"] == step
        assert sorted(p.name for p in checkpoints.glob("step_*.pt")) == [f"step_{step}.pt"]
    resumed = subprocess.run(
        [sys.executable, "-m", "mtkit", "train", "-c", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert ("resuming from" in resumed.stderr) == (step > 0)
    got = _weights(run)
    assert all(torch.equal(got[k], straight[k]) for k in straight)


@pytest.mark.parametrize(
    "loader_workers, sig",
    [
        (2, "SIGTERM"),
        pytest.param(1, "SIGTERM", marks=pytest.mark.slow),
        pytest.param(2, "SIGINT", marks=pytest.mark.slow),
    ],
)
def test_a_signal_to_the_group_of_mtkit_run_stops_after_the_checkpoint(
    prepared, corpus, tmp_path, loader_workers, sig
):
    """`mtkit run` (the stages before training are finished: the prepared run directory)
    stops with the training's checkpoint and does not go on to translate the test set."""
    config, run = _config(prepared, tmp_path, corpus, loader_workers)
    stopped = _signalled(["run", "-c", config], "mtkit.training.loop", "apply_update", sig, 2)
    assert stopped.returncode == 128 + getattr(signal, sig), stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"interrupted: stopped by {sig} after saving a checkpoint; rerun to go on"
    )
    assert load_checkpoint(run / "checkpoints" / "last.pt")["train"]["progress"]["step"] == 3
    assert not (run / "test.hyp").exists()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_of_preprocess_with_workers_stops_in_one_line(corpus, tmp_path, sig):
    """Encoding in two worker processes (the corpus made to look big enough for them, in
    chunks of 200 pairs): the group gets the signal after the second chunk is written.
    The workers print nothing (a worker's KeyboardInterrupt traceback was seen), the
    command says one word and exits 130/143, and no shard is left half-written."""
    run = tmp_path / "run"
    data = tiny_config_dict(corpus, run, data={"workers": 2})
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(data))
    assert (
        subprocess.run(
            [sys.executable, "-m", "mtkit", "tokenizer", "-c", str(config)],
            capture_output=True,
            cwd=ROOT,
        ).returncode
        == 0
    )
    before = sorted(p.name for p in run.iterdir())
    big = (
        "import mtkit.stages.preprocess, mtkit.data.sources as s;"
        "mtkit.stages.preprocess.preprocess.__defaults__ = (1,);"
        "s.Corpus.chunks.__defaults__ = (200,)"
    )
    stopped = _signalled(
        ["preprocess", "-c", config], "mtkit.data.shards", "ShardWriter.append", sig, 1, prelude=big
    )
    assert stopped.returncode == 128 + getattr(signal, sig), stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        "interrupted" if sig == "SIGINT" else "terminated"
    )
    assert not (run / "data").exists()
    assert sorted(p.name for p in run.iterdir()) == before


_KILLED_MID_ENCODING = """
import multiprocessing, os, runpy, signal, sys
pids_file, config = sys.argv[1:3]
import mtkit.data.shards as shards, mtkit.data.sources as sources, mtkit.stages.preprocess as p
p.preprocess.__defaults__ = (1,)  # workers for any corpus
sources.Corpus.chunks.__defaults__ = (200,)
real = shards.ShardWriter.append
def append(self, *args, **kwargs):
    real(self, *args, **kwargs)
    with open(pids_file, "w") as f:
        f.write(" ".join(str(c.pid) for c in multiprocessing.active_children()))
    os.kill(os.getpid(), signal.SIGKILL)
shards.ShardWriter.append = append
sys.argv = ["mtkit", "preprocess", "-c", config]
runpy.run_module("mtkit", run_name="__main__", alter_sys=True)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\tZ" not in next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, StopIteration):
        return False


def test_encoding_workers_end_when_preprocess_is_killed(corpus, tmp_path):
    """The workers ignore stop signals, so nothing but their own watch would end them
    once SIGKILL took their parent: they do, within seconds, rather than wait forever."""
    run = tmp_path / "run"
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(corpus, run, data={"workers": 2})))
    assert (
        subprocess.run(
            [sys.executable, "-m", "mtkit", "tokenizer", "-c", str(config)],
            capture_output=True,
            cwd=ROOT,
        ).returncode
        == 0
    )
    pids_file = tmp_path / "workers"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_ENCODING, str(pids_file), str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    workers = [int(x) for x in pids_file.read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 15
    while any(_running(pid) for pid in workers):
        assert time.monotonic() < deadline, "encoding workers outlived their parent"
        time.sleep(0.2)


_HELPER_PIDS = """
import mtkit.engines.workers as workers
_start = workers.BatchWorkers.__init__
def recorded(self, *args, **kwargs):
    _start(self, *args, **kwargs)
    with open({path!r}, "w") as f:
        f.write(" ".join(str(h.pid) for h in self.helpers))
workers.BatchWorkers.__init__ = recorded
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_of_translate_with_helpers_stops_them_all(trained, tmp_path, sig):
    """`translate --workers 2`: the group gets the signal while the engine's process and
    its helper translate (at the engine's third batch). The helper ignores it, as every
    worker does; the command says one word and exits 130/143, leaves no output file,
    and no helper outlives it."""
    source, out, pids = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "pids"
    source.write_text("".join(f"{line}\n" for line in read_lines("test2016.en.gz", 300)))
    stopped = _signalled(
        ["translate", "-m", trained / "run" / "checkpoints" / "best.pt", "--workers", 2,
         "--batch-tokens", 60, "-i", source, "-o", out],
        "mtkit.engines.workers",
        "BatchWorkers._ready",
        sig,
        2,
        prelude=_HELPER_PIDS.format(path=str(pids)),
    )  # fmt: skip
    assert stopped.returncode == 128 + getattr(signal, sig), stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        "interrupted" if sig == "SIGINT" else "terminated"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "pids"]
    helpers = [int(pid) for pid in pids.read_text().split()]
    assert helpers  # there was one
    deadline = time.time() + 10
    while any(_running(pid) for pid in helpers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in helpers)

"""Translation helpers (`translate --workers`, `mtkit.engines.workers`) that die or fail
at any moment: the command ends within seconds with one line
naming the helper and its exit code (or what it failed at), exit code 2, and no output
file, temporary or process left.

The faults are injected deterministically, through the library's one hook point
(`mtkit.core.faults`): helper_faults.py makes helper 1 kill itself (SIGKILL) at a chosen
moment, fail to load, or replace the model file just before it loads it; a start that
fails half-way meets a real open-file limit. Each command is a process of its own, run
under a timeout (a hang fails the test) and marked by an environment variable that its
helpers inherit, so that any process it leaves is found (/proc/PID/environ).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mtkit.core.checkpoint import CheckpointError
from mtkit.engines.helper_pipes import HEADER, Channel
from mtkit.engines.pytorch_loading import helper_engine

from faultkit import ROOT, wait_for
from helper_faults import asked

# `python -m mtkit` with torch's threads set first: with --workers 2, one thread each
# makes the helper a fork of the command's process, two a spawned process that loads the
# model again (on any machine: torch would take its cores)
RUN = (
    "import runpy, sys, torch; torch.set_num_threads(int(sys.argv.pop(1)));"
    " runpy.run_module('mtkit', run_name='__main__', alter_sys=True)"
)
FORKED, SPAWNED = 2, 4
LIMIT_S = 90  # a command that runs longer hangs (they end in 3 to 12 s on 2 busy cores)
MARK = "MTKIT_TEST_MARK"


def translate(
    model: Path, source: Path, out: Path, threads: int, fault: str = "", workers: int = 2, **run
) -> tuple[subprocess.CompletedProcess, str]:
    """`mtkit -q translate` of `source` into `out` with `workers` on `threads`, the fault
    `fault`; the result and the mark its processes carry."""
    mark = uuid.uuid4().hex
    env = asked(fault, os.environ) | {"MTKIT_CACHE_DIR": "", MARK: mark}
    args = ["-q", "translate", "-m", model, "-i", source, "-o", out, "--workers", workers]
    args += ["--batch-tokens", 40, "--max-len-a", 0, "--max-len-b", 10]  # many short batches
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(threads), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        **run,
    )
    return proc, mark


def marked(mark: str) -> list[int]:
    """The processes that carry `mark` in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and f"{MARK}={mark}".encode() in (entry / "environ").read_bytes()
            ):
                found.append(int(entry.name))
        except OSError:  # ended meanwhile, or not ours
            continue
    return found


def assert_ended_cleanly(proc: subprocess.CompletedProcess, out: Path, mark: str, says: str):
    """Exit code 2, one line that says `says`, nothing on stdout, no output file, no
    temporary beside it, and no process of the command left (a moment granted to
    multiprocessing's resource tracker, which ends when the command's process has)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, lines
    assert says in lines[0], lines[0]
    assert proc.stdout == ""
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*"))
    deadline = time.monotonic() + 5
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left: {left}"
    return lines[0]


KILLED = "translation helper process 1 of 1 (pid "
SIGKILLED = "stopped with exit code -9 (killed by SIGKILL"

# A helper dies at a moment of a batch only if it takes one. With a fault asked, the
# engine's process takes no batch before every helper has loaded (`BatchWorkers.run`),
# and the kill tests translate the 2,000 training lines, so that batches are left for
# the helper to take. With the 100 test lines and no such wait, a loaded machine once
# let the engine's process translate them all while a spawned helper loaded: the
# command ended well, and the test failed.
# Every moment a forked helper can die at
FORKED_MOMENTS = ["start", "loading", "taking", "before-send", "mid-send", "after-send"]
# A spawned helper's own moments: before and while it loads, and half-way through a result
SPAWNED_MOMENTS = ["start", "loading", "mid-send"]


@pytest.fixture
def model(trained) -> Path:
    return trained / "run" / "checkpoints" / "step_20.pt"


@pytest.mark.parametrize("moment", FORKED_MOMENTS)
def test_a_forked_helper_that_dies_at_any_moment_is_one_line(model, corpus, tmp_path, moment):
    out = tmp_path / "out.de"
    proc, mark = translate(model, corpus["train.en"], out, FORKED, f"kill:{moment}")
    line = assert_ended_cleanly(proc, out, mark, KILLED)
    assert SIGKILLED in line and "translate with --workers 1" in line


@pytest.mark.parametrize("moment", SPAWNED_MOMENTS)
def test_a_spawned_helper_that_dies_at_any_moment_is_one_line(model, corpus, tmp_path, moment):
    out = tmp_path / "out.de"
    proc, mark = translate(model, corpus["train.en"], out, SPAWNED, f"kill:{moment}")
    assert SIGKILLED in assert_ended_cleanly(proc, out, mark, KILLED)


def test_a_spawned_helper_that_cannot_load_ends_the_command(model, corpus, tmp_path):
    """Once the error was printed, then the command never ended (the inbox's
    feeder thread, stuck writing 2,000 lines' batches to a helper that never reads them,
    was joined at exit)."""
    out = tmp_path / "out.de"
    proc, mark = translate(model, corpus["train.en"], out, SPAWNED, "fail:loading")
    assert_ended_cleanly(
        proc, out, mark, "failed: could not load the model: RuntimeError: a load failure"
    )


def test_a_model_file_replaced_before_a_helper_loads_it_is_one_line(trained, corpus, tmp_path):
    """Training or `mtkit average` may replace -m between the command's load
    and a spawned helper's: the helper would then translate part of the input with
    other weights and exit 0; instead none of the output is written."""
    checkpoints = trained / "run" / "checkpoints"
    model = shutil.copy(checkpoints / "step_20.pt", tmp_path / "model.pt")
    out = tmp_path / "out.de"
    swap = f"swap:{model}{os.pathsep}{checkpoints / 'step_10.pt'}"
    proc, mark = translate(model, corpus["test.en"], out, SPAWNED, swap)
    assert_ended_cleanly(
        proc,
        out,
        mark,
        f"could not load the model: the model file changed since this command loaded it: "
        f"{model} holds other weights now",
    )


def test_a_helper_start_that_fails_half_way_names_its_cause(model, corpus, tmp_path):
    """Out of file descriptors at the 18th helper or so, the command once hung
    at exit with the helpers started (unregistered, and deaf to SIGTERM), and said "too
    many open files while writing OUT"."""

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    out = tmp_path / "out.de"
    proc, mark = translate(model, corpus["test.en"], out, FORKED, workers=64, preexec_fn=few_files)
    line = assert_ended_cleanly(
        proc, out, mark, "too many open files while starting translation helper process"
    )
    assert "of 63 (open-file limit 100)" in line and "writing" not in line


def test_helpers_end_when_the_command_is_killed_while_they_write(model, corpus, tmp_path):
    """The command's process killed (SIGKILL) while its helpers are blocked writing
    results it does not read (stopped first), or read a 2,000-line input's batches it
    was writing to them: they end, each after the batch it translates. A fork held a
    copy of the engine's end of its own pipe, so its write never failed, and a helper
    read the rest of a half-written inbox message: both waited forever."""
    mark = uuid.uuid4().hex
    env = asked("", os.environ) | {"MTKIT_CACHE_DIR": "", MARK: mark}
    args = ["-q", "translate", "-m", model, "-i", corpus["train.en"], "-o", tmp_path / "out"]
    args += ["--workers", 3, "--beam", 4, "--nbest", 4, "--alignments"]  # large results
    args += ["--batch-tokens", 2000, "--max-len-a", 0, "--max-len-b", 40]
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, "3", *map(str, args)], cwd=ROOT, env=env, text=True
    )
    try:
        wait_for(lambda: len(marked(mark)) >= 3, proc)  # the command and two helpers
        helpers = [pid for pid in marked(mark) if pid != proc.pid]
        wait_for(lambda: any(cpu_s(pid) > 0.2 for pid in helpers), proc)  # translating
        proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: any("pipe_write" in wchan(pid) for pid in helpers))
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30  # (a helper first ends the batch it translates)
        while (left := marked(mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes left: {left}"
    finally:
        for pid in [proc.pid, *marked(mark)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cpu_s(pid: int) -> float:
    """The processor seconds process `pid` has used since it started (its own, not
    counting what it had before a fork)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wchan(pid: int) -> str:
    """Where in the kernel process `pid` sleeps ("anon_pipe_write": writing to a full
    pipe)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def test_no_fault_no_line(model, corpus, tmp_path):
    """The same command without a fault: the translation, and no process left."""
    out = tmp_path / "out.de"
    proc, mark = translate(model, corpus["test.en"], out, FORKED)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert len(out.read_text().splitlines()) == 100
    time.sleep(0.5)
    assert not marked(mark)


def test_a_fault_point_does_nothing_unless_a_test_names_a_fault():
    """`mtkit.core.faults.fault_point` is a no-op where no fault is asked; asked, it acts
    at its own moment of its own helper only."""
    code = (
        "from mtkit.core.faults import fault_point as at;"
        " at('helper-start', helper=1); at('helper-loading', helper=2); print('up');"
        " at('helper-start', helper=2); print('still up')"
    )
    for fault, code_wanted, said in (("", 0, "up\nstill up\n"), ("kill:start@2", -9, "up\n")):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=asked(fault, os.environ),
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
        assert (proc.returncode, proc.stdout) == (code_wanted, said), proc.stderr


def test_a_half_written_message_is_never_waited_for():
    """The engine's end of a helper's pipe takes whole messages only: half of one (its
    helper killed while writing it) is kept, and reading never blocks on the rest."""
    import multiprocessing
    import pickle

    reader, writer = multiprocessing.Pipe(duplex=False)
    channel = Channel(reader)
    whole = pickle.dumps(("result", 1, 0, ["a"]))
    message = len(whole).to_bytes(HEADER, "big") + whole
    os.write(writer.fileno(), message + message[: len(message) // 2])
    started = time.monotonic()
    assert channel.read() == [("result", 1, 0, ["a"])]
    assert channel.read() == [] and not channel.ended  # the rest is not there: no wait
    os.write(writer.fileno(), message[len(message) // 2 :])
    assert channel.read() == [("result", 1, 0, ["a"])]
    writer.close()
    assert channel.read() == [] and channel.ended
    assert time.monotonic() - started < 1
    reader.close()


def test_a_helper_checks_that_it_loads_the_weights_its_engine_loaded(trained):
    checkpoint = str(trained / "run" / "checkpoints" / "step_20.pt")
    with pytest.raises(CheckpointError, match="the model file changed since this command"):
        helper_engine([checkpoint], "fp32", None, ["0" * 64])
    engine = helper_engine([checkpoint], "fp32", None)
    assert helper_engine([checkpoint], "fp32", None, engine.digests).digests == engine.digests

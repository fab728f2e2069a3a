"""One writer per run directory: a second one stops at once naming the first one's pid."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from mtkit.core.rundir import RunDirError, run_lock

from faultkit import ROOT, assert_one_line, cli, mtkit_process, snapshot, wait_for


def hold_lock(run, stage="train") -> subprocess.Popen:
    """Another process that holds the run directory's lock until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from mtkit.core.rundir import run_lock
        with run_lock({str(run)!r}, {stage!r}):
            print("locked", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_every_writing_stage_refuses_a_run_dir_in_use(work):
    run = work / "run"
    holder = hold_lock(run)
    try:
        before = snapshot(run)
        for stage in ("tokenizer", "preprocess", "train", "run"):
            assert_one_line(
                cli(stage, "-c", work / "exp.yaml"),
                says=f"is in use by pid {holder.pid} (mtkit train)",
            )
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_second_mtkit_train_exits_2_and_the_first_one_goes_on(work):
    run = work / "run"
    first = mtkit_process(
        "train",
        "-c",
        work / "exp.yaml",
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.valid_every=1000",
    )
    try:
        wait_for(lambda: b"mtkit train" in (run / ".lock").read_bytes(), first)
        result = cli("train", "-c", work / "exp.yaml", "--set", "train.max_steps=400")
        assert_one_line(result, says=f"in use by pid {first.pid} (mtkit train)")
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "Traceback" not in err


def test_a_lock_left_by_a_dead_process_does_not_block(work):
    run = work / "run"
    holder = hold_lock(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert "pid" in (run / ".lock").read_text()  # the file stays, the lock does not
    result = cli("train", "-c", work / "exp.yaml", "--set", "train.max_steps=22")
    assert result.exit_code == 0, result.output


def test_the_lock_is_reentrant_in_one_process_and_released_after(tmp_path):
    with run_lock(tmp_path, "run"), run_lock(tmp_path, "train"):
        pass
    with run_lock(tmp_path, "train"):  # released: can be taken again
        pass
    proc = hold_lock(tmp_path, "preprocess")
    try:
        with pytest.raises(RunDirError, match=rf"in use by pid {proc.pid} \(mtkit preprocess\)"):
            with run_lock(tmp_path, "train"):
                pass
    finally:
        proc.kill()
        proc.wait()

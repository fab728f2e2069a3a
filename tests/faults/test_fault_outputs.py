"""Outputs never clobber inputs or checkpoints; an interrupted write leaves the old file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest

from mtkit.core.checkpoint import load_checkpoint

from faultkit import assert_one_line, cli, mtkit_process, snapshot, wait_for


@pytest.fixture
def ckpts(work):
    return work / "run" / "checkpoints"


def test_output_that_is_the_input_is_refused_and_the_input_kept(work, ckpts):
    text = work / "a.txt"
    text.write_text("A dog runs.\nTwo men talk.\n")
    os.link(text, work / "hard.txt")
    os.symlink(text, work / "soft.txt")
    before = snapshot(work)
    for out in (text, work / "hard.txt", work / "soft.txt"):
        line = assert_one_line(
            cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", out),
            says="is the same file as --input",
        )
        assert line.startswith("error: the output ")
    assert snapshot(work) == before


def test_output_that_is_the_model_is_refused_and_no_checkpoint_changes(work, ckpts):
    before = snapshot(ckpts)
    for out in (ckpts / "last.pt", ckpts / "best.pt"):
        assert_one_line(
            cli("translate", "-m", out, "-o", out, input="A dog.\n"),
            says="is the same file as --model",
        )
    assert_one_line(
        cli("average", ckpts / "step_10.pt", ckpts / "step_20.pt", "-o", ckpts / "step_10.pt"),
        says="is the same file as checkpoint 1",
    )
    assert snapshot(ckpts) == before


def test_a_folder_or_a_name_too_long_as_output_is_one_line(work, ckpts, monkeypatch):
    (work / "in.txt").write_text("A dog.\n")
    monkeypatch.chdir(work)
    before = snapshot(work)
    for out, says in (
        ("run", "error: run is a folder; the output must be a file"),
        ("x" * 256, "error: " + "x" * 256 + ": file name too long"),
    ):
        line = assert_one_line(
            cli("translate", "-m", ckpts / "best.pt", "-i", "in.txt", "-o", out), says=says
        )
        assert ".tmp" not in line  # the user's name, not the temporary's
    assert snapshot(work) == before and sorted(p.name for p in work.iterdir()) == [
        "exp.yaml",
        "in.txt",
        "run",
    ]


def test_another_checkpoint_named_as_output_is_replaced_and_no_other(work, ckpts):
    """Only the input files are protected: `-o last.pt` with `-m best.pt` is the user's
    choice, and writes the translation there (through a new file: no other name changes)."""
    before = snapshot(ckpts)
    result = cli("translate", "-m", ckpts / "best.pt", "-o", ckpts / "last.pt", input="A dog.\n")
    assert result.exit_code == 0, result.output
    assert len((ckpts / "last.pt").read_text().splitlines()) == 1
    del before[ckpts / "last.pt"]
    assert snapshot(ckpts, skip=("last.pt",)) == before


def test_checkpoints_are_separate_files_so_a_write_through_one_name_spares_the_others(ckpts):
    names = ("last.pt", "best.pt", "step_10.pt", "step_20.pt")
    inodes = {os.stat(ckpts / n).st_ino for n in names}
    assert len(inodes) == len(names)
    assert all(os.stat(ckpts / n).st_nlink == 1 for n in names)
    before = snapshot(ckpts)
    with open(ckpts / "last.pt", "r+b") as f:  # a user's tool writing in place
        f.write(b"oops")
    assert snapshot(ckpts / "best.pt", ckpts / "step_20.pt") == {
        k: v for k, v in before.items() if k.name in ("best.pt", "step_20.pt")
    }


def test_a_failing_translation_leaves_the_old_output_and_no_temporary(work, ckpts, monkeypatch):
    text, out = work / "in.txt", work / "out.txt"
    text.write_text("A dog.\n" * 5)
    out.write_text("the user's earlier translation\n")
    before = snapshot(work)

    def interrupted(*args, **kwargs):
        args[2].write("half of the output\n")
        raise KeyboardInterrupt

    monkeypatch.setattr("mtkit.engines.session.translate_stream", interrupted)
    assert_one_line(
        cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", out),
        code=130,
        says="interrupted",
    )
    assert snapshot(work) == before


@pytest.mark.parametrize(
    "sig, code, says", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_in_translate_keeps_the_output_file_and_leaves_no_temporary(
    work, ckpts, sig, code, says
):
    """Ctrl-C, and SIGTERM (which left the temporary file behind). The signal comes after
    an observable event (the first lines' translation reached the temporary file) while
    standard input is still open, so translate is waiting for more lines: the signal
    cannot arrive after the work is done, however fast the machine. (A long input closed
    at once did not ensure that: a fast machine finished 20,000 lines first.)"""
    out = work / "out.txt"
    out.write_text("keep me\n")
    proc = mtkit_process("translate", "-m", ckpts / "best.pt", "-o", out, stdin=subprocess.PIPE)
    proc.stdin.write("A dog runs in the park.\n" * 100)
    proc.stdin.flush()  # and left open
    wait_for(
        lambda: any(
            p.name.startswith(".out.txt.") and p.stat().st_size > 0 for p in work.iterdir()
        ),
        proc,
    )
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.close()
    assert proc.stderr.read().strip() == says
    assert out.read_text() == "keep me\n"
    assert sorted(p.name for p in work.iterdir()) == ["exp.yaml", "out.txt", "run"]


def test_the_temporary_of_a_killed_translate_is_removed_by_the_next_write(work, ckpts):
    """SIGKILL runs no cleanup: the temporary stays until the next write of the same file,
    which removes it, and leaves a live writer's and another host's alone."""
    out = work / "out.txt"
    out.write_text("keep me\n")
    proc = mtkit_process("translate", "-m", ckpts / "best.pt", "-o", out, stdin=subprocess.PIPE)
    proc.stdin.write("A dog runs in the park.\n" * 100)
    proc.stdin.flush()  # and left open

    def temporaries() -> list:
        return [p for p in work.iterdir() if p.name.startswith(".out.txt.")]

    wait_for(lambda: any(p.stat().st_size > 0 for p in temporaries()), proc)
    proc.kill()
    proc.wait(timeout=60)
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.close()
    (killed,) = temporaries()
    assert killed.name.startswith(f".out.txt.{proc.pid}@") and out.read_text() == "keep me\n"
    host = killed.name.split("@", 1)[1].split(".", 1)[0]
    live = work / f".out.txt.{os.getpid()}@{host}.abcdefgh.tmp"  # a write under way
    elsewhere = work / f".out.txt.{proc.pid}@another-host.abcdefgh.tmp"  # a shared folder's
    for p in (live, elsewhere):
        p.write_text("partial")
    (work / "in.txt").write_text("A dog.\n")
    result = cli("translate", "-m", ckpts / "best.pt", "-i", work / "in.txt", "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(temporaries()) == sorted([live, elsewhere]) and out.read_text() != "keep me\n"


def test_output_is_written_whole_on_success(work, ckpts):
    text, out = work / "in.txt", work / "out.txt"
    text.write_text("A dog.\n\nTwo men.\n")
    out.write_text("old\n")
    result = cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", out)
    assert result.exit_code == 0, result.output
    assert len(out.read_text().split("\n")) == 4 and out.read_text() != "old\n"
    assert load_checkpoint(ckpts / "best.pt")["model"]  # untouched and intact


def test_a_reader_that_leaves_the_pipe_stops_translate_quietly(work, ckpts):
    proc = mtkit_process("translate", "-m", ckpts / "best.pt", "--beam", "1", stdin=subprocess.PIPE)
    proc.stdin.write("A dog runs in the park.\n" * 3000)
    proc.stdin.close()
    assert proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == ""

"""A full disk and a read-only run directory: one line naming the path, nothing lost."""

from __future__ import annotations

import errno
import os

import torch

from mtkit.data.shards import _HashedFile

from faultkit import assert_one_line, cli, snapshot

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_saving_a_checkpoint_keeps_the_earlier_ones(work, monkeypatch):
    ckpts = work / "run" / "checkpoints"
    before = snapshot(ckpts)
    real_save = torch.save

    def save_until_full(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)):  # a checkpoint written by mtkit
            f.write(b"PK\x03\x04" + b"\0" * 4000)
            raise RuntimeError("PytorchStreamWriter failed writing file") from ENOSPC
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_full)
    result = cli("--quiet", "train", "-c", work / "exp.yaml", "--set", "train.max_steps=40")
    line = assert_one_line(result, says="no space left on device while writing ")
    assert line.endswith(f"{ckpts.resolve()}/step_30.pt; earlier checkpoints are intact")
    assert snapshot(ckpts) == before  # nothing half-written, no temporary left


def test_disk_full_while_preprocessing_leaves_the_old_data(work, monkeypatch):
    run = work / "run"
    before = snapshot(run / "data")
    calls = []
    write = _HashedFile.write

    def write_until_full(self, data):
        calls.append(self.path)
        if len(calls) > 4:  # mid-way through the first chunk of train
            raise ENOSPC
        write(self, data)

    monkeypatch.setattr(_HashedFile, "write", write_until_full)
    assert_one_line(
        cli("preprocess", "-c", work / "exp.yaml"),
        says=f"error: no space left on device while writing {run}/data",
    )
    assert snapshot(run / "data") == before
    assert not [p for p in run.iterdir() if p.name.startswith(".data")]


def open_files() -> list[str]:
    """What this process's file descriptors point at."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor of the listing itself, closed by now
            pass
    return paths


def test_a_really_full_disk_is_one_line(work, tmpfs):
    small = tmpfs("200k")  # smaller than the 240 KB spm.model
    run = small / "run"
    result = cli("tokenizer", "-c", work / "exp.yaml", "--set", f"run_dir={run}")
    assert_one_line(result, says="no space left on device while writing ")
    assert not [p for p in run.rglob("*.tmp")]
    run = tmpfs("300k") / "run"  # the tokenizer fits; the shards do not
    run.mkdir()
    for name in ("spm.model", "spm.vocab"):
        (run / name).write_bytes((work / "run" / name).read_bytes())
    result = cli("preprocess", "-c", work / "exp.yaml", "--set", f"run_dir={run}")
    assert_one_line(result, says=f"error: no space left on device while writing {run}/data")
    assert sorted(p.name for p in run.iterdir()) == [".lock", "spm.model", "spm.vocab"]
    assert not [p for p in open_files() if p.startswith(str(run))]  # no descriptor left


def test_a_read_only_run_directory_is_one_line_naming_it(work, tmpfs):
    readonly = tmpfs("1m", readonly=True)
    for stage in ("tokenizer", "preprocess", "train", "run"):
        for run in (readonly, readonly / "sub"):
            assert_one_line(
                cli(stage, "-c", work / "exp.yaml", "--set", f"run_dir={run}"),
                says=f"cannot write to the run directory {run} (read-only file system)",
            )


def test_an_unwritable_run_directory_is_one_line_naming_it(work, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied", str(args[0]))

    monkeypatch.setattr("mtkit.core.rundir.os.open", refuse)  # as a non-root user would meet
    before = snapshot(work)
    for stage in ("tokenizer", "preprocess", "train"):
        assert_one_line(
            cli(stage, "-c", work / "exp.yaml"),
            says=f"cannot write to the run directory {work / 'run'} (permission denied)",
        )
    assert snapshot(work) == before

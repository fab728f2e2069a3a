"""Choices measured on this machine and kept (`mtkit.tuning.measured`): a later process
takes the first process's choice, so that it translates the same input the same way."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import stat
import threading
import time

import pytest
import torch

from mtkit.tuning import attention, measured
from mtkit.tuning.attention import AttentionShape, choose_decoding_attention
from mtkit.tuning.measured import remembered


@pytest.fixture
def kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / measured.FILE


def a_kernel(record: dict) -> bool:  # what these tests' choices may be
    return record.get("kernel") in ("sdpa", "matmul")


def counting(record: dict):
    calls = []

    def measure():
        calls.append(1)
        return dict(record)

    return measure, calls


def test_a_choice_is_measured_once_and_then_kept(kept):
    measure, calls = counting({"kernel": "matmul", "matmul_ms": 1.0})
    assert remembered("attention", {"rows": 500}, measure, a_kernel) == {
        "kernel": "matmul",
        "matmul_ms": 1.0,
    }
    other, other_calls = counting({"kernel": "sdpa"})  # a later process would measure this
    assert remembered("attention", {"rows": 500}, other, a_kernel) == {
        "kernel": "matmul",
        "matmul_ms": 1.0,
    }
    assert calls == [1] and other_calls == []
    assert remembered("attention", {"rows": 600}, other, a_kernel) == {
        "kernel": "sdpa"
    }  # another key
    assert remembered("precision", {"rows": 500}, other, a_kernel) == {
        "kernel": "sdpa"
    }  # another kind
    assert len(json.loads(kept.read_text())) == 3


def test_processes_measuring_at_once_take_the_first_finished_choice(kept):
    """Two measure at once, each to its own kernel (the ranks of a torchrun job loading
    their models; threads here, each locking the folder as a process does): both take the
    one kept first, which a later process then takes too."""
    both_measuring = threading.Barrier(2, timeout=60)  # each has found no entry
    chosen = {}

    def load(kernel: str) -> None:
        def measure():
            both_measuring.wait()
            return {"kernel": kernel}

        chosen[kernel] = remembered("attention", {"rows": 500}, measure, a_kernel)

    loading = [threading.Thread(target=load, args=(k,)) for k in ("sdpa", "matmul")]
    for thread in loading:
        thread.start()
    for thread in loading:
        thread.join()
    assert chosen["sdpa"] == chosen["matmul"]
    assert json.loads(kept.read_text()) == {'attention {"rows": 500}': chosen["sdpa"]}


def test_a_lock_held_too_long_delays_the_write_only_so_long(kept, monkeypatch):
    """A process forked while another held the folder's lock holds it until it exits:
    the write waits `LOCK_WAIT_S` at most, then goes on unlocked."""
    kept.parent.mkdir(parents=True)
    monkeypatch.setattr(measured, "LOCK_WAIT_S", 0.2)
    holder = os.open(kept.parent, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        measure, _ = counting({"kernel": "sdpa"})
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    finally:
        os.close(holder)
    assert json.loads(kept.read_text()) == {"attention {}": {"kernel": "sdpa"}}


def test_an_unreadable_or_unwritable_cache_measures_every_time(kept, tmp_path, monkeypatch):
    kept.parent.mkdir(parents=True)
    kept.write_text("{not json")
    measure, calls = counting({"kernel": "sdpa"})
    assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}  # and rewrites it
    assert json.loads(kept.read_text()) == {"attention {}": {"kernel": "sdpa"}}
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(blocker / "cache"))  # cannot be made
    assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    assert len(calls) == 3


def test_an_empty_cache_dir_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("MTKIT_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measure, calls = counting({"kernel": "sdpa"})
    remembered("attention", {}, measure, a_kernel)
    remembered("attention", {}, measure, a_kernel)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_the_default_place_is_xdgs_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("MTKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert measured.cache_dir() == tmp_path / "mtkit"


def test_translations_attention_kernel_is_the_first_measurement_on_this_machine(kept, monkeypatch):
    """Two processes' timings on either side of the margin: the second takes the first's
    kernel (a test's own `measure` is never kept)."""
    shape = AttentionShape(batch=8, length=5, heads=2, head_dim=4)
    timings = iter([{"sdpa": 1.0, "matmul": 0.5}, {"sdpa": 0.5, "matmul": 1.0}])

    def timer(shape, dtype):  # each process's real timer
        times = next(timings)
        return lambda kernel: times[kernel]

    monkeypatch.setattr(attention, "decoding_attention_timer", timer)
    cpu = torch.device("cpu")
    first = choose_decoding_attention(cpu, None, shape)
    assert first["kernel"] == "matmul"
    assert choose_decoding_attention(cpu, None, shape) == first  # not measured again
    assert choose_decoding_attention(cpu, torch.bfloat16, shape)["kernel"] == "sdpa"  # new key
    fake = choose_decoding_attention(cpu, None, shape, lambda k: {"sdpa": 1, "matmul": 2}[k])
    assert fake["kernel"] == "sdpa"  # measured as given, not the kept one


def test_translations_precision_auto_is_the_first_measurement_on_this_machine(kept, monkeypatch):
    from mtkit.core.config import Config
    from mtkit.tuning import precision
    from mtkit.tuning.precision import Calibration

    answers = iter([(torch.bfloat16, Calibration(2.0, 1.0)), (None, Calibration(1.0, 2.0))])
    monkeypatch.setattr(  # auto measures (the first answer, then the other), fp32 does not
        precision,
        "resolve_precision",
        lambda asked, *args, **kwargs: next(answers) if asked == "auto" else (None, None),
    )
    cpu = torch.device("cpu")
    dtype, record = precision.inference_precision("auto", cpu, Config())
    assert dtype is torch.bfloat16 and record["calibration"] == {
        "fp32_ms": 2000.0,
        "bf16_ms": 1000.0,
    }
    assert precision.inference_precision("auto", cpu, Config()) == (dtype, record)  # kept
    assert precision.inference_precision("fp32", cpu, Config()) == (
        None,
        {"precision": "fp32", "asked": "fp32"},
    )  # asked for: nothing measured or kept


def test_a_choice_kept_for_one_cpus_kernels_is_measured_again_under_others(kept, monkeypatch):
    """`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 CPU: its kernels are AVX2's, bf16 among
    them; a precision measured on the CPU's own is not theirs."""
    from mtkit.core.config import Config
    from mtkit.tuning import precision
    from mtkit.tuning.precision import Calibration

    answers = iter([(torch.bfloat16, Calibration(2.0, 1.0)), (None, Calibration(1.0, 4.0))])
    monkeypatch.setattr(
        precision, "resolve_precision", lambda asked, *args, **kwargs: next(answers)
    )
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert precision.inference_precision("auto", cpu, Config())[0] is torch.bfloat16
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    dtype, record = precision.inference_precision("auto", cpu, Config())
    assert dtype is None and record["calibration"]["bf16_ms"] == 4000.0  # measured again
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert precision.inference_precision("auto", cpu, Config())[0] is torch.bfloat16  # kept


def warnings_of(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == measured.__name__ and r.levelno == logging.WARNING
    ]


@pytest.fixture
def no_hang():
    """A read or write that would wait on a named pipe fails the test instead of hanging it."""

    def hung(signum, frame):
        raise AssertionError("waited on the named pipe")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "entry",
    [
        {"kernel": "flash"},  # as a later mtkit sharing the cache could keep
        5,
        {},
        "sdpa",
        None,
        ["sdpa"],
        {"kernel": "sdpa", "sdpa_ms": "fast"},
        {"kernel": "matmul", "matmul_ms": -1.0},
    ],
)
def test_a_kept_attention_kernel_this_mtkit_cannot_run_is_measured_again(
    kept, monkeypatch, caplog, entry
):
    shape = AttentionShape(batch=8, length=5, heads=2, head_dim=4)
    timers = []

    def timer(shape, dtype):
        timers.append(1)
        return lambda kernel: {"sdpa": 1.0, "matmul": 0.5}[kernel]

    monkeypatch.setattr(attention, "decoding_attention_timer", timer)
    cpu = torch.device("cpu")
    first = choose_decoding_attention(cpu, None, shape)
    [name] = json.loads(kept.read_text())
    kept.write_text(json.dumps({name: entry}))
    with caplog.at_level(logging.WARNING):
        assert choose_decoding_attention(cpu, None, shape) == first  # measured again
        assert choose_decoding_attention(cpu, None, shape) == first  # and kept again
    assert len(timers) == 2 and json.loads(kept.read_text()) == {name: first}
    [warning] = warnings_of(caplog)
    assert str(kept) in warning and "decoding attention" in warning


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"precision": "int8", "asked": "auto"},  # int8 is only ever asked for
        {"precision": "bf16", "asked": "fp32"},
        {"precision": "bf16", "asked": "auto", "calibration": 5},
        {"precision": "bf16", "asked": "auto", "calibration": {"fp32_ms": float("nan")}},
        "bf16",
    ],
)
def test_a_kept_precision_this_mtkit_cannot_choose_is_measured_again(
    kept, monkeypatch, caplog, entry
):
    from mtkit.core.config import Config
    from mtkit.tuning import precision
    from mtkit.tuning.precision import Calibration

    calls = []

    def resolve(asked, *args, **kwargs):
        calls.append(asked)
        return torch.bfloat16, Calibration(2.0, 1.0)

    monkeypatch.setattr(precision, "resolve_precision", resolve)
    cpu = torch.device("cpu")
    first = precision.inference_precision("auto", cpu, Config())
    [name] = json.loads(kept.read_text())
    kept.write_text(json.dumps({name: entry}))
    with caplog.at_level(logging.WARNING):
        assert precision.inference_precision("auto", cpu, Config()) == first  # measured again
        assert precision.inference_precision("auto", cpu, Config()) == first  # and kept again
    assert calls == ["auto", "auto"] and json.loads(kept.read_text()) == {name: first[1]}
    [warning] = warnings_of(caplog)
    assert str(kept) in warning and "translation precision" in warning


def test_entries_under_other_names_are_kept_as_they_are(kept, caplog):
    kept.parent.mkdir(parents=True)
    theirs = {'attention {"rows": 1}': {"kernel": "flash", "flash_ms": 0.1}}  # a later mtkit's
    kept.write_text(json.dumps(theirs))
    measure, calls = counting({"kernel": "sdpa"})
    with caplog.at_level(logging.WARNING):
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    assert json.loads(kept.read_text()) == {**theirs, "attention {}": {"kernel": "sdpa"}}
    assert warnings_of(caplog) == []  # not this process's entry: not its business


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe\x00 not UTF-8",
        b"[" * 100_000 + b"]" * 100_000,  # too deep for the parser (RecursionError)
        b'["attention {}", {"kernel": "matmul"}]',  # not an object
        b"5",
        b"",
    ],
)
def test_a_file_that_is_not_a_json_object_counts_as_empty_and_is_replaced(kept, caplog, content):
    kept.parent.mkdir(parents=True)
    kept.write_bytes(content)
    measure, calls = counting({"kernel": "sdpa"})
    with caplog.at_level(logging.WARNING):
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    assert len(calls) == 1 and json.loads(kept.read_text()) == {"attention {}": {"kernel": "sdpa"}}
    [warning] = warnings_of(caplog)
    assert str(kept) in warning


def test_a_file_too_large_to_be_a_cache_is_not_read(kept, monkeypatch, caplog):
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"attention {}": {"kernel": "matmul"}, "padding": "x" * 100}))
    monkeypatch.setattr(measured, "MAX_BYTES", 64)
    measure, calls = counting({"kernel": "sdpa"})
    with caplog.at_level(logging.WARNING):
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    [warning] = warnings_of(caplog)
    assert str(kept) in warning and "larger than 64 bytes" in warning


def a_named_pipe(path, elsewhere):
    os.mkfifo(path)


def a_folder(path, elsewhere):
    path.mkdir()


def a_link_to_a_cache(path, elsewhere):  # which a read must not take, nor a write replace
    elsewhere.write_text(json.dumps({"attention {}": {"kernel": "matmul"}}))
    path.symlink_to(elsewhere)


def a_dangling_link(path, elsewhere):  # whose target a write must not create
    path.symlink_to(elsewhere)


@pytest.mark.parametrize("make", [a_named_pipe, a_folder, a_link_to_a_cache, a_dangling_link])
def test_what_is_not_a_regular_file_is_never_read_nor_written_through(
    kept, tmp_path, caplog, no_hang, make
):
    kept.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.json"
    make(kept, elsewhere)
    before = os.lstat(kept)
    target = elsewhere.read_bytes() if elsewhere.exists() else None
    measure, calls = counting({"kernel": "sdpa"})
    with caplog.at_level(logging.WARNING):
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
        assert remembered("attention", {}, measure, a_kernel) == {"kernel": "sdpa"}
    assert len(calls) == 2  # nothing kept while it is there
    after = os.lstat(kept)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (
        before.st_ino,
        stat.S_IFMT(before.st_mode),
    )
    assert (elsewhere.read_bytes() if elsewhere.exists() else None) == target
    assert sorted(p.name for p in kept.parent.iterdir()) == [measured.FILE]  # no temporary
    [warning] = warnings_of(caplog)  # once for the process
    assert str(kept) in warning and "not a regular file" in warning


def test_a_write_leaves_one_file_and_removes_the_stale_temporaries_of_killed_writes(kept):
    folder = kept.parent
    folder.mkdir(parents=True)
    killed = folder / ".measured.json.killed.tmp"
    killed.write_text("{")
    os.utime(killed, (0, 0))  # left long ago
    running = folder / ".measured.json.running.tmp"
    running.write_text("{")
    later = time.time() + 3600  # a write under way, however slowly this test runs
    os.utime(running, (later, later))
    stale_folder = folder / ".measured.json.folder.tmp"
    stale_folder.mkdir()
    os.utime(stale_folder, (0, 0))
    other = folder / "other.tmp"
    other.write_text("mine")
    os.utime(other, (0, 0))
    measure, _ = counting({"kernel": "sdpa"})
    remembered("attention", {}, measure, a_kernel)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [measured.FILE, running.name, stale_folder.name, other.name]
    )
    assert json.loads(kept.read_text()) == {"attention {}": {"kernel": "sdpa"}}

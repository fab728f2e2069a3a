"""Shared helpers for the fault tests: CLI calls, one-line errors, byte snapshots (the
`trained` and `work` fixtures are in tests/conftest.py).

Every fault test checks three things: the exit code, that stderr is one line without a
traceback, and that the files the user owned are byte-identical afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner, Result

from mtkit.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def cli(*args, input: str | bytes | None = None) -> Result:
    return runner.invoke(app, [str(a) for a in args], input=input)


def assert_one_line(result, code: int = 2, says: str = "") -> str:
    """The exit code, one stderr line, no traceback; returns the line."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1, lines
    assert says in lines[0], lines[0]
    return lines[0]


def snapshot(*paths: Path, skip: tuple[str, ...] = ()) -> dict[Path, bytes]:
    """Every file under `paths` with its bytes, to compare before and after a fault;
    files or folders named in `skip` (a run directory's `.lock`, the datasets `cache`)
    are left out."""
    files = {}
    for path in paths:
        for p in [path] if path.is_file() else sorted(path.rglob("*")):
            if p.is_file() and not set(skip).intersection(p.relative_to(path).parts):
                files[p] = p.read_bytes()
    return files


# Ctrl-C as a foreground command gets it: a process started in the background of a
# non-interactive shell (`.ci/run &`) inherits SIGINT ignored, and Python then keeps it
# ignored, so the Ctrl-C test would wait forever there.
_FOREGROUND = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('mtkit', run_name='__main__', alter_sys=True)"
)


def mtkit_process(*args, **popen) -> subprocess.Popen:
    """`python -m mtkit ARGS` as a real process (for signals and the lock), with Ctrl-C
    handled as in a foreground command whatever this process ignores."""
    return subprocess.Popen(
        [sys.executable, "-c", _FOREGROUND, *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended early: {proc.communicate()[1][-2000:]}")
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)

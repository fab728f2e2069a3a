"""The command line reads at a glance: `mtkit --version`, and each command's options
grouped under headings by purpose, each group short enough for one screen."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREEN = 24  # lines of a terminal


def _help(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mtkit", *command, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"COLUMNS": "100", "TERM": "dumb", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _panels(text: str) -> dict[str, list[str]]:
    """Each boxed group of the help: its heading and its lines."""
    panels, current = {}, None
    for line in text.splitlines():
        if heading := re.match(r"╭─ (.+?) ─", line):
            current = panels.setdefault(heading.group(1), [])
        elif line.startswith("╰"):
            current = None
        elif current is not None:
            current.append(line)
    return panels


def test_mtkit_version_prints_the_installed_version():
    done = subprocess.run(
        [sys.executable, "-m", "mtkit", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"mtkit {version('mtkit')}"


@pytest.mark.parametrize(
    "command, groups",
    [
        (
            "translate",
            [
                "Model",
                "Input and output",
                "Search",
                "Sampling",
                "Terminology",
                "Languages",
                "Device and speed",
                "Markup (html, xml)",
            ],
        ),
        ("eval", ["Model", "Input and output", "Terminology", "Languages", "Device and speed"]),
        (
            "serve",
            [
                "Model",
                "Server",
                "Documents (/v2/document, /translate_file)",
                "Search",
                "Sampling",
                "Terminology",
                "Languages",
                "Device and speed",
            ],
        ),
    ],
)
def test_options_are_grouped_by_purpose_and_each_group_fits_a_screen(command, groups):
    panels = _panels(_help(command))
    assert [p for p in panels if p != "Options"] == groups
    assert [line for line in panels["Options"] if "--" in line] == [
        line for line in panels["Options"] if "--help" in line
    ]  # only --help left over
    for heading, lines in panels.items():
        assert len(lines) <= SCREEN, (heading, len(lines))

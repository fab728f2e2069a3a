"""The page of `mtkit serve` in headless Chromium: benchmarks/serve_page.py types a
sentence, waits for the translation and its alignment grid, and saves a screenshot.
Skipped where Chromium, chromedriver or Selenium is missing (CI has none of them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.browser


@pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver",
)
def test_the_page_translates_typed_text_and_draws_its_alignment(trained, tmp_path):
    pytest.importorskip("selenium")
    pytest.importorskip("fastapi")
    shot = tmp_path / "page.png"
    done = subprocess.run(
        [
            sys.executable,
            "serve_page.py",
            "-m",
            str(trained / "run" / "checkpoints" / "best.pt"),
            "--text",
            "A dog runs.",
            "--out",
            str(shot),
        ],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["translation"] and result["alignment_links"] >= 1
    assert "en → de" in result["about"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000

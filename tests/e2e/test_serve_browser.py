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


@pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver",
)
def test_the_page_translates_paragraphs_markup_and_files(trained, tmp_path):
    """Typed paragraphs (each split into sentences by the server), pasted HTML (its tags
    carried through, shown as text), and files: uploaded, translated, offered for
    download; a file the server cannot read is an error in words."""
    pytest.importorskip("selenium")
    httpx = pytest.importorskip("httpx")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serve_page import browser

    from mtkit.documents.markup import tags

    from serverkit import LocalServer

    page = (
        "<html><body><h1>A dog.</h1><p>A man is <b>riding</b> a bike. Two dogs play.</p>"
        "</body></html>\n"
    )
    (tmp_path / "page.html").write_text(page)
    (tmp_path / "bad.srt").write_text("not a subtitle file\n")
    paragraphs = ["A dog runs. Two men talk.", "A girl sings!"]
    with LocalServer(trained / "run" / "checkpoints" / "best.pt") as server:
        expected = server.translate(paragraphs, split=True)
        status, answer = server.request(
            "POST",
            "/v2/translate",
            {"text": ["<p>A <b>dog</b> runs.</p>"], "target_lang": "DE", "tag_handling": "html"},
        )
        assert status == 200, answer
        markup = answer["translations"][0]["text"]
        as_file = httpx.post(
            f"{server.url}/translate_file",
            data={"source": "en", "target": "de"},
            files={"file": ("page.html", page.encode())},
            timeout=120,
        )
        translated_page = httpx.get(as_file.json()["translatedFileUrl"]).text
        driver = browser()
        try:
            driver.get(server.url + "/")
            wait = WebDriverWait(driver, 60)
            by_id = lambda name: driver.find_element(By.ID, name)  # noqa: E731
            wait.until(lambda d: "loading" not in by_id("about").text)
            by_id("source").send_keys("\n".join(paragraphs))
            by_id("translate").click()
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "table.alignment"))
            shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".sentence")]
            assert shown == expected and "2 paragraph(s), 3 sentence(s)" in by_id("status").text

            by_id("source").clear()
            Select(by_id("format")).select_by_value("html")
            by_id("source").send_keys("<p>A <b>dog</b> runs.</p>")
            by_id("translate").click()
            wait.until(lambda d: d.find_elements(By.ID, "markup"))
            assert by_id("markup").text == markup and "<b>" in markup

            by_id("file").send_keys(str(tmp_path / "page.html"))
            by_id("translate_file").click()
            wait.until(lambda d: by_id("download").is_displayed())
            assert by_id("download").get_attribute("download") == "page.html"
            got = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(document.getElementById('download').href).then((r) => r.text()).then(done);"
            )
            assert got == translated_page and tags(got) == tags(page)
            assert by_id("file_status").text == "done"

            by_id("file").send_keys(str(tmp_path / "bad.srt"))
            by_id("translate_file").click()
            wait.until(lambda d: "error" in by_id("file_status").get_attribute("class"))
            words = by_id("file_status").text
            assert words.startswith("error: ") and len(words) > len("error: ") + 10, words
            assert not by_id("download").is_displayed()
        finally:
            driver.quit()

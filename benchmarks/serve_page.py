"""The web page of `mtkit serve` in a real browser (headless Chromium via Selenium):
load it, type a sentence, press Translate, wait for the translation and its alignment
grid, and save a screenshot.

    python benchmarks/serve_page.py -m runs/multi30k/checkpoints/best.pt \\
        [--text "A man in an orange hat is riding a bike."] [--out benchmarks/serve_page.png]

Needs Debian's `chromium` and `chromium-driver` packages and `pip install selenium` (in
`mtkit[bench]`). Prints one JSON line: the translation, the alignment cells drawn, the
seconds it took in the browser. Exit code 1 when the page did not show the translation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverkit import LocalServer  # noqa: E402 (tests/serverkit.py)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1100,900",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def check_page(url: str, text: str, out: Path, timeout: float = 60) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser()
    try:
        driver.get(url)
        wait = WebDriverWait(driver, timeout)
        wait.until(lambda d: "loading" not in d.find_element(By.ID, "about").text)
        driver.find_element(By.ID, "source").send_keys(text)  # real keystrokes
        start = time.perf_counter()
        driver.find_element(By.ID, "translate").click()
        wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "table.alignment")))
        seconds = time.perf_counter() - start
        translation = driver.find_element(By.CSS_SELECTOR, ".sentence.selected").text
        links = len(driver.find_elements(By.CSS_SELECTOR, "table.alignment td.link"))
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        return {
            "translation": translation,
            "alignment_links": links,
            "about": driver.find_element(By.ID, "about").text,
            "seconds_in_browser": round(seconds, 2),
            "screenshot": str(out),
        }
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--text", default="A man in an orange hat is riding a bike.")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/serve_page.png"))
    args = parser.parse_args()
    with LocalServer(args.model, "--device", "cpu") as server:
        result = check_page(server.url + "/", args.text, args.out)
    print(json.dumps(result, ensure_ascii=False))
    sys.exit(0 if result["translation"] and result["alignment_links"] else 1)


if __name__ == "__main__":
    main()

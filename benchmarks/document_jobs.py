"""Document jobs beside text clients on one `mtkit serve`: does translating documents in
the background (DeepL's /v2/document) hold up the text requests arriving meanwhile?

    python benchmarks/document_jobs.py -m runs/multi30k/checkpoints/best.pt \\
        [--documents 8] [--paragraphs 12] [--clients 32] [--requests 4]

Each document is an HTML page of `--paragraphs` paragraphs of 1-4 consecutive test2016
sentences (seeded) with a bold word each; each text client sends `--requests` /v1
requests of 1-4 sentences, one after another. The text clients run three times: alone,
with the documents uploaded at the same moment (each polled every 0.2 s and downloaded),
and alone again (a shared machine's drift shows between the two runs alone).
Reports errors (any answer but 200, a document that ends in an error or comes back with
other tags than it had), the text requests' median and 90th-percentile latency in both
runs and their ratio, and the documents' seconds. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverkit import LocalServer  # noqa: E402 (tests/serverkit.py)

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
POLL_S = 0.2


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(x.split(":", 1)[1].strip() for x in out.splitlines() if "Model name" in x)
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    import httpx

    from mtkit.documents.markup import tags

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--documents", type=int, default=8)
    ap.add_argument("--paragraphs", type=int, default=12)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="per text client")
    args = ap.parse_args()
    with gzip.open(DATA / "test2016.en.gz", "rt", encoding="utf-8") as f:
        lines = [x.strip() for x in f]
    rng = random.Random(1)

    def run_of_sentences() -> list[str]:
        start = rng.randrange(len(lines) - 4)
        return lines[start : start + rng.randint(1, 4)]

    texts = [[run_of_sentences() for _ in range(args.requests)] for _ in range(args.clients)]
    pages = []
    for _ in range(args.documents):
        paragraphs = []
        for sentences in (run_of_sentences() for _ in range(args.paragraphs)):
            first, _, rest = sentences[0].partition(" ")
            paragraphs.append(f"<p><b>{first}</b> {' '.join([rest, *sentences[1:]])}</p>")
        pages.append("<html><body>\n" + "\n".join(paragraphs) + "\n</body></html>\n")

    errors: list[str] = []
    with LocalServer(args.model) as server:
        client = httpx.Client(base_url=server.url, timeout=600)

        def text_client(k: int) -> list[float]:
            seconds = []
            for request in texts[k]:
                start = time.perf_counter()
                r = client.post("/v1/translate", json={"text": request})
                seconds.append(time.perf_counter() - start)
                if r.status_code != 200:
                    errors.append(f"text: HTTP {r.status_code} {r.text[:200]}")
            return seconds

        def text_run() -> list[float]:
            with ThreadPoolExecutor(args.clients) as pool:
                return [
                    s for client_s in pool.map(text_client, range(args.clients)) for s in client_s
                ]

        def document(k: int) -> float:
            start = time.perf_counter()
            r = client.post(
                "/v2/document",
                data={"target_lang": "DE"},
                files={"file": (f"page{k}.html", pages[k].encode())},
            )
            if r.status_code != 200:
                errors.append(f"document {k}: HTTP {r.status_code} {r.text[:200]}")
                return 0.0
            job = r.json()
            while True:
                status = client.post(f"/v2/document/{job['document_id']}", json=job).json()
                if status["status"] in ("done", "error"):
                    break
                time.sleep(POLL_S)
            if status["status"] == "error":
                errors.append(f"document {k}: {status.get('error_message')}")
                return 0.0
            got = client.post(f"/v2/document/{job['document_id']}/result", json=job)
            if got.status_code != 200 or tags(got.text) != tags(pages[k]):
                errors.append(f"document {k}: HTTP {got.status_code}, tags changed")
            return time.perf_counter() - start

        text_run()  # warm up (the first requests load what they load)
        alone = text_run()
        with ThreadPoolExecutor(args.documents) as pool:
            documents = [pool.submit(document, k) for k in range(args.documents)]
            beside = text_run()
            running = sum(not d.done() for d in documents)  # still translating at its end
            document_s = [d.result() for d in documents]
        after = text_run()  # alone again: the machine's drift shows between the two
        code, _ = server.stop()

    def ms(values: list[float], q: float) -> float:
        return round(1000 * statistics.quantiles(values, n=100)[int(q * 100) - 1], 1)

    median_alone = statistics.median(alone + after)
    median_beside = statistics.median(beside)
    print(
        json.dumps(
            {
                "cpu": cpu_model(),
                "documents": args.documents,
                "document_sentences": args.documents * args.paragraphs,
                "text_clients": args.clients,
                "text_requests": len(beside),
                "errors": len(errors),
                "first_errors": errors[:3],
                "text_median_ms_alone": round(1000 * median_alone, 1),
                "text_median_ms_alone_before_and_after": [
                    round(1000 * statistics.median(alone), 1),
                    round(1000 * statistics.median(after), 1),
                ],
                "text_median_ms_beside_documents": round(1000 * median_beside, 1),
                "median_ratio": round(median_beside / median_alone, 2),
                "text_p90_ms_alone": ms(alone + after, 0.9),
                "text_p90_ms_beside_documents": ms(beside, 0.9),
                "documents_running_when_text_ended": running,
                "document_seconds_max": round(max(document_s), 2),
                "server_exit": code,
            },
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()

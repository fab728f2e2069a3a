"""Clients of three protocols at once against one `mtkit serve`: its own /v1/translate,
LibreTranslate's (libretranslatepy) and DeepL's (the deepl client), every call they make.

    python benchmarks/protocols_load.py -m runs/multi30k/checkpoints/best.pt \\
        [--clients 32] [--requests 96] [--sentences 200]

Each request is a run of 1-4 consecutive test2016 sentences (seeded), sent by N client
threads in turn through the three protocols; every answer is compared with the same
request sent alone, one by one, before the load (the same outputs: 0 differences, and
no HTTP 500). Also each client's calls besides translate: LibreTranslate's languages and
detect (where py3langid is installed), DeepL's languages and usage. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverkit import LocalServer  # noqa: E402 (tests/serverkit.py)

DATA = Path(__file__).resolve().parent.parent / "data" / "multi30k"
KEY = "benchmark-key"


def main() -> None:
    import deepl
    from libretranslatepy import LibreTranslateAPI

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--precision", default=None, help="serve --precision (default: auto)")
    args = ap.parse_args()
    with gzip.open(DATA / "test2016.en.gz", "rt", encoding="utf-8") as f:
        lines = [x.strip() for x in f][: args.sentences]
    rng = random.Random(1)
    requests = []
    for _ in range(args.requests):
        start = rng.randrange(len(lines))
        requests.append(lines[start : start + rng.randint(1, 4)])

    extra = ["--precision", args.precision] if args.precision else []
    with LocalServer(args.model, "--api-key", KEY, *extra) as server:
        url = f"http://127.0.0.1:{server.port}"
        lt = LibreTranslateAPI(url, api_key=KEY)
        dl = deepl.Translator(KEY, server_url=url)
        errors: list[str] = []

        def send(k: int) -> list[str]:
            texts = requests[k]
            try:
                if k % 3 == 0:
                    return [lt.translate(x, "en", "de") for x in texts]
                if k % 3 == 1:
                    return [r.text for r in dl.translate_text(texts, target_lang="DE")]
                status, body = server.request(
                    "POST", "/v1/translate", {"text": texts},
                    headers={"Authorization": f"Bearer {KEY}"},
                )  # fmt: skip
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body}")
                return [t["text"] for t in body["translations"]]
            except (urllib.error.HTTPError, deepl.DeepLException, RuntimeError) as e:
                errors.append(f"request {k}: {e}")
                return []

        alone = [send(k) for k in range(len(requests))]  # one by one, before the load
        start = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            loaded = list(pool.map(send, range(len(requests))))
        seconds = time.perf_counter() - start
        others = {"lt_languages": lt.languages(), "deepl_usage": dl.get_usage().character.count}
        others["deepl_target_languages"] = [x.code for x in dl.get_target_languages()]
        try:
            others["lt_detect"] = lt.detect(lines[0])
        except urllib.error.HTTPError as e:
            others["lt_detect"] = f"HTTP {e.code} (py3langid not installed?)"
        code, stderr = server.stop()
    differ = [k for k, (a, b) in enumerate(zip(alone, loaded)) if a != b]
    print(
        json.dumps(
            {
                "clients": args.clients,
                "requests": len(requests),
                "sentences": sum(map(len, requests)),
                "differing_answers": len(differ),
                "differing_protocols": sorted({("lt", "deepl", "v1")[k % 3] for k in differ}),
                "errors": len(errors),
                "http_500": sum("HTTP 500" in e or "500" in e.split(":")[1] for e in errors),
                "first_errors": errors[:3],
                "sentences_per_s_under_load": round(sum(map(len, requests)) / seconds, 1),
                "server_exit": code,
                **others,
            },
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()

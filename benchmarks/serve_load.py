"""Load on `mtkit serve`: throughput, latency and memory under 1, 8 and 32 concurrent
clients, against offline translation of the same sentences in the same run.

    python benchmarks/serve_load.py -m runs/multi30k/checkpoints/best.pt \\
        [--src data/multi30k/test2016.en.gz] [--requests 120] [--clients 1,8,32] \\
        [--max-wait-ms MS] [--rounds]

A fixed list of requests (1-8 consecutive test sentences each, seeded) is sent by N
client threads that take the next request as soon as their last one is answered. For
greedy and beam 5 it prints one JSON line with, per client count: sentences/s, p50/p95/
p99 latency (ms), errors, and the ratio to offline throughput (`Translator.translate` on
all the sentences at once, in this process: the mean of a run before the server starts
and one after its load). At 1 client it also gives p99 latency over the p99 of each
request translated alone, offline. Memory: the server's peak RSS (VmHWM) and that of one
`mtkit translate` process on the same input. The server runs on a free loopback port
and is stopped at the end. `--rounds` also serves greedy with `mtkit serve --rounds`
(no continuous batching), in the same run, for comparison.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from train_throughput import process_peak_rss_mb

from mtkit.core.device import tune_cpu_runtime
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine

from serverkit import LocalServer  # noqa: E402 (tests/serverkit.py)


def make_requests(path: str, count: int, seed: int = 1) -> list[list[str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [x.rstrip("\n") for x in f]
    rng = random.Random(seed)
    out, at = [], 0
    for _ in range(count):
        n = rng.randint(1, 8)
        out.append([lines[(at + i) % len(lines)] for i in range(n)])
        at += n
    return out


def percentile(values: list[float], q: float) -> float:
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(round(q / 100 * (len(ranked) - 1))))]


def offline(checkpoint: str, requests: list[list[str]], beam: int) -> dict:
    """Offline figures in this process: all sentences at once, and each request alone;
    `again()` measures the first once more (the load's ratio uses the mean of both)."""
    translator = load_engine(checkpoint, "cpu")
    opts = replace(SearchOptions.from_config(translator.config.decode), beam=beam)
    sentences = [x for r in requests for x in r]
    translator.translate(sentences[:50], opts)  # warm-up

    def throughput() -> float:
        start = time.perf_counter()
        translator.translate(sentences, opts)
        return len(sentences) / (time.perf_counter() - start)

    batch = throughput()
    alone = []
    for r in requests:
        start = time.perf_counter()
        translator.translate(r, opts)
        alone.append(time.perf_counter() - start)
    return {"sentences_per_s": batch, "alone_ms": [1000 * a for a in alone], "again": throughput}


def load(server: LocalServer, requests: list[list[str]], clients: int, beam: int) -> dict:
    todo = list(enumerate(requests))
    lock = threading.Lock()
    latencies: list[float] = []
    errors = 0

    def client() -> None:
        nonlocal errors
        while True:
            with lock:
                if not todo:
                    return
                _, lines = todo.pop(0)
            start = time.perf_counter()
            try:
                status, _ = server.request("POST", "/v1/translate", {"text": lines, "beam": beam})
            except OSError:
                status = 0
            with lock:
                latencies.append(1000 * (time.perf_counter() - start))
                errors += status != 200

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {
        "sentences_per_s": sum(len(r) for r in requests) / elapsed,
        "latencies": latencies,
        "errors": errors,
    }


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def translate_process_rss_mb(checkpoint: str, requests: list[list[str]]) -> float:
    """Peak RSS of one `mtkit translate` process on the same sentences."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.writelines(x + "\n" for r in requests for x in r)
    try:
        return process_peak_rss_mb(["translate", "-m", checkpoint, "-i", f.name, "--device", "cpu"])
    finally:
        os.unlink(f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument(
        "--rounds",
        action="store_true",
        help="also serve greedy with --rounds (no continuous batching)",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=None,
        help="the server's --max-wait-ms (default: its own)",
    )
    args = parser.parse_args()
    tune_cpu_runtime()
    requests = make_requests(args.src, args.requests)
    result: dict = {
        "model": args.model,
        "requests": len(requests),
        "sentences": sum(len(r) for r in requests),
    }
    baselines = {beam: offline(args.model, requests, beam) for beam in (1, 5)}
    result["translate_process_peak_rss_mb"] = round(translate_process_rss_mb(args.model, requests))
    extra = [] if args.max_wait_ms is None else ["--max-wait-ms", str(args.max_wait_ms)]
    clients = [int(c) for c in args.clients.split(",")]

    def measure(server: LocalServer, beam: int) -> dict[int, dict]:
        load(server, requests[:10], 1, beam)  # warm-up
        return {n: load(server, requests, n, beam) for n in clients}

    with LocalServer(args.model, "--device", "cpu", *extra) as server:
        loads = {"beam5": (5, measure(server, 5)), "greedy": (1, measure(server, 1))}
        result["server_peak_rss_mb"] = round(peak_rss_mb(server.proc.pid))
    if args.rounds:
        with LocalServer(args.model, "--device", "cpu", "--rounds", *extra) as server:
            loads["greedy_rounds"] = (1, measure(server, 1))
    # Offline again, after the load: the machine's speed drifts, and the ratios use the
    # mean of the figures taken before and after.
    for beam, base in baselines.items():
        runs = [base["sentences_per_s"], base["again"]()]
        base["sentences_per_s"] = sum(runs) / 2
        name = "beam5" if beam == 5 else "greedy"
        result[f"{name}_offline_sentences_per_s"] = [round(x, 1) for x in runs]
    for name, (beam, runs) in loads.items():
        base = baselines[beam]
        for n, run in runs.items():
            lat = run["latencies"]
            entry = {
                "sentences_per_s": round(run["sentences_per_s"], 1),
                "vs_offline": round(run["sentences_per_s"] / base["sentences_per_s"], 2),
                **{f"p{q}_ms": round(percentile(lat, q)) for q in (50, 95, 99)},
                "errors": run["errors"],
            }
            if n == 1:
                entry["p99_vs_alone_p99"] = round(
                    percentile(lat, 99) / percentile(base["alone_ms"], 99), 2
                )
            result[f"{name}_clients{n}"] = entry
    result["server_rss_vs_translate"] = round(
        result["server_peak_rss_mb"] / result["translate_process_peak_rss_mb"], 2
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""A server for replicas, measured: what scraping /metrics every second costs `mtkit serve`
in throughput (goal: at most 2%), and what clients of two replicas behind haproxy see when
one is stopped (SIGTERM) or killed (SIGKILL) mid-load (goal: 0 requests lost, 0 HTTP 500).

    python benchmarks/metrics_cost.py -m runs/multi30k/checkpoints/best.pt \\
        [--src data/multi30k/test2016.en.gz] [--requests 600] [--clients 16] [--pairs 3] \\
        [--replica-clients 64] [--replica-requests 800]

Throughput: a fixed list of requests (1-8 consecutive sentences each, seeded) sent by
`--clients` threads to one server, `--pairs` times without and with a scraper that GETs
/metrics every second, in alternating order (without-with, with-without, ...) so that a
drift of the machine falls on both; the cost is 1 - median(with) / median(without). The
replicas: `--replica-clients` threads send `--replica-requests` through haproxy
(deploy/haproxy/haproxy.cfg, tests/serverkit.py `Balancer`), and one replica is stopped
after a quarter are answered; the answers are counted by kind. Skipped without
`haproxy`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serve_load import make_requests  # noqa: E402 (benchmarks/serve_load.py)

from serverkit import Balancer, LocalServer, send_load, wait_ready  # noqa: E402

SCRAPE_EVERY_S = 1.0


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def scraper(port: int, stop: threading.Event, scrapes: list[int]) -> None:
    """GET /metrics every `SCRAPE_EVERY_S` until `stop`, as Prometheus would."""
    while not stop.wait(SCRAPE_EVERY_S):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            response.read()
            scrapes.append(response.status)
        finally:
            conn.close()


def throughput(server: LocalServer, requests: list[list[str]], clients: int, scraped: bool):
    """Sentences per second of `requests` sent by `clients`, with a 1 s scraper or not."""
    stop, scrapes = threading.Event(), []
    thread = threading.Thread(target=scraper, args=(server.port, stop, scrapes))
    if scraped:
        thread.start()
    start = time.perf_counter()
    outcomes = send_load(server, requests, clients)
    seconds = time.perf_counter() - start
    stop.set()
    if scraped:
        thread.join()
    assert outcomes == {"200": len(requests)}, outcomes
    assert all(s == 200 for s in scrapes), scrapes
    return sum(map(len, requests)) / seconds, len(scrapes)


def cpu_per_scrape_and_request() -> dict:
    """The CPU time (this thread's) of one scrape of a registry holding every route's
    series, and of what `Recorded` does per request: the figures that a loaded, shared
    machine's throughput noise cannot hide."""
    from mtkit.serving.metrics import open_metrics

    metrics = open_metrics(lambda: 0, lambda: True)
    routes = ["/v1/translate", "/v1/health", "/v1/ready", "/v1/info", "/metrics", "other"]
    routes += ["/translate", "/languages", "/v2/translate", "/v2/usage", "/v2/languages"]
    for route in routes:
        for status in ("2xx", "4xx", "5xx"):
            metrics.requests.labels(route, status).inc()
        metrics.latency.labels(route).observe(0.1)
    n = 2000
    start = time.thread_time()
    for _ in range(n // 10):
        metrics.scrape()
    scrape_ms = 1000 * (time.thread_time() - start) / (n // 10)
    start = time.thread_time()
    for i in range(n):
        metrics.requests.labels("/v1/translate", "2xx").inc()
        metrics.latency.labels("/v1/translate").observe(i / n)
        metrics.batch_ran(4, 60)
        metrics.translated(4, 80)
    request_us = 1e6 * (time.thread_time() - start) / n
    return {
        "scrape_cpu_ms": round(scrape_ms, 3),
        "scraped_every_second_share_of_one_core_percent": round(scrape_ms / 10, 3),
        "per_request_recording_cpu_us": round(request_us, 1),
    }


def metrics_cost(args, requests: list[list[str]]) -> dict:
    with LocalServer(args.model) as server:
        wait_ready(server)
        send_load(server, requests[:50], args.clients)  # warm-up
        runs = {False: [], True: []}
        scrapes = 0
        for pair in range(args.pairs):
            for scraped in (False, True) if pair % 2 == 0 else (True, False):
                rate, n = throughput(server, requests, args.clients, scraped)
                print(f"scraped={scraped}: {rate:.1f} sentences/s", file=sys.stderr, flush=True)
                runs[scraped].append(rate)
                scrapes += n
    without, with_ = statistics.median(runs[False]), statistics.median(runs[True])
    return {
        "sentences_per_s_without": [round(r, 1) for r in runs[False]],
        "sentences_per_s_with_scraper": [round(r, 1) for r in runs[True]],
        "scrapes": scrapes,
        "cost_percent": round(100 * (1 - with_ / without), 2),
    }


def replicas_killed(args, requests: list[list[str]]) -> dict:
    counts = {}
    for stop in (signal.SIGTERM, signal.SIGKILL):
        servers = [LocalServer(args.model, "--drain-delay", "1") for _ in range(2)]
        try:
            for server in servers:
                wait_ready(server)
            with tempfile.TemporaryDirectory() as folder:
                with Balancer(servers, Path(folder)) as balancer:
                    balancer.wait_states({"r0": "UP", "r1": "UP"})
                    outcomes = send_load(
                        balancer,
                        requests,
                        args.replica_clients,
                        len(requests) // 4,
                        functools.partial(servers[1].proc.send_signal, stop),
                    )
            counts[signal.Signals(stop).name] = dict(outcomes)
            print(f"{signal.Signals(stop).name}: {dict(outcomes)}", file=sys.stderr, flush=True)
        finally:
            for server in servers:
                server.stop()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--src", default="data/multi30k/test2016.en.gz")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--replica-clients", type=int, default=64)
    parser.add_argument("--replica-requests", type=int, default=800)
    args = parser.parse_args()
    requests = make_requests(args.src, args.requests)
    result = {"cpu_name": cpu_name(), "model": args.model, "clients": args.clients}
    result["cpu"] = cpu_per_scrape_and_request()
    result["metrics_scraped_every_second"] = metrics_cost(args, requests)
    if shutil.which("haproxy"):
        result["two_replicas_one_stopped"] = replicas_killed(
            args, make_requests(args.src, args.replica_requests, seed=2)
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

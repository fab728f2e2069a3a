"""A real `mtkit serve` process on a free loopback port, for the serving benchmarks and
tests: start it, wait until it answers, call it with the standard library, stop it."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """`python -m mtkit serve -m CHECKPOINT --port P ARGS...` on 127.0.0.1."""

    def __init__(
        self,
        checkpoint: str | Path,
        *args: str,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mtkit",
                "serve",
                "-m",
                str(checkpoint),
                "--port",
                str(self.port),
                *map(str, args),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.time() + timeout
        while True:
            try:
                if self.get("/v1/health")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server ended: {self.proc.communicate()[1][-2000:]}")
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("the server did not start")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        timeout: float = 120,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(
                method,
                path,
                body=json.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json", **(headers or {})},
            )
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
        """POST `body` as JSON: the status and the raw answer."""
        return _post(self.port, path, body, timeout)

    def get(self, path: str) -> tuple[int, dict]:
        return self.request("GET", path, timeout=2)

    def translate(self, lines: list[str], **extra) -> list[str]:
        status, answer = self.request("POST", "/v1/translate", {"text": lines, **extra})
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {answer}")
        return [t["text"] for t in answer["translations"]]

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # never left running past the test
            self.proc.kill()
            self.proc.communicate()
            raise
        return self.proc.returncode, err

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _post(port: int, path: str, body: dict, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_ready(server: LocalServer, timeout: float = 120) -> None:
    """Until `server`'s /v1/ready answers 200 (its warm-up search has run)."""
    deadline = time.time() + timeout
    while server.get("/v1/ready")[0] != 200:
        if time.time() > deadline:
            raise RuntimeError("the server did not become ready")
        time.sleep(0.05)


HAPROXY_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"


class Balancer:
    """Debian's haproxy in front of `replicas` (LocalServers), run with the recipe's
    config (`HAPROXY_CONFIG`: round robin among the replicas whose /v1/ready says 200,
    with retries) on free loopback ports, checking every `check_ms`. Needs `haproxy` on
    PATH."""

    def __init__(self, replicas: list[LocalServer], folder: Path, check_ms: int = 100):
        self.port, self.stats_port = free_port(), free_port()
        text = HAPROXY_CONFIG.read_text()
        text = text.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{self.port}")
        text = text.replace("bind 127.0.0.1:8404", f"bind 127.0.0.1:{self.stats_port}")
        text = re.sub(r"\n    server .*", "", text)  # the recipe's replicas, then ours
        servers = "".join(
            f"\n    server r{i} 127.0.0.1:{r.port} check inter {check_ms}ms fall 1 rise 1"
            for i, r in enumerate(replicas)
        )
        check = "http-check expect status 200"
        text = text.replace(check, check + servers)
        config = folder / "haproxy.cfg"
        config.write_text(text)
        self.log = ""  # what haproxy wrote (a line per request), once stopped
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def states(self) -> dict[str, str]:
        """Each replica's state as haproxy sees it ({"r0": "UP", "r1": "DOWN", ...})."""
        conn = http.client.HTTPConnection("127.0.0.1", self.stats_port, timeout=2)
        try:
            conn.request("GET", "/stats;csv")
            rows = conn.getresponse().read().decode().splitlines()
        finally:
            conn.close()
        header = rows[0].lstrip("# ").split(",")
        named = [dict(zip(header, row.split(","), strict=False)) for row in rows[1:] if row]
        return {
            r["svname"]: r["status"].split()[0]
            for r in named
            if r["pxname"] == "replicas" and r["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_states(self, wanted: dict[str, str], timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if self.states() == wanted:
                    return
            except OSError:  # haproxy not listening yet
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy ended: {self.proc.communicate()[0][-2000:]}")
            if time.time() > deadline:
                raise RuntimeError(f"haproxy saw {self.states()}, not {wanted}")
            time.sleep(0.05)

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
        """POST `body` as JSON through haproxy: the status and the raw answer."""
        return _post(self.port, path, body, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.log = self.proc.communicate(timeout=30)[0]

    def __enter__(self) -> Balancer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def send_load(
    server: LocalServer | Balancer,
    requests: list[list[str]],
    clients: int,
    midway_after: int = 0,
    midway: Callable[[], object] | None = None,
    retry_cut: bool = False,
) -> Counter:
    """`requests` (each a list of texts) sent to POST /v1/translate of `server` by
    `clients` threads, each sending the next as soon as its last is answered; `midway()`
    runs once `midway_after` are answered. Returns the outcomes: "200" (a translation
    per text), "503 clean" (in /v1's JSON error shape), "503 other", any other status,
    or the exception a client met (a request lost: no answer at all). `retry_cut`: a
    response cut short (a server killed after its headers went out: nothing can resend
    it) is sent once more, as the deepl client does, and counted as "cut, then" its
    outcome."""
    outcomes: Counter = Counter()
    lock = threading.Lock()
    todo = iter(requests)

    def client() -> None:
        while True:
            with lock:
                texts = next(todo, None)
            if texts is None:
                return
            outcome = _sent(server, texts)
            if retry_cut and outcome == "IncompleteRead":
                outcome = "cut, then " + _sent(server, texts)
            with lock:
                outcomes[outcome] += 1
                if midway and sum(outcomes.values()) == midway_after:
                    threading.Thread(target=midway).start()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _sent(server: LocalServer | Balancer, texts: list[str]) -> str:
    """One POST /v1/translate of `texts` and its outcome (`send_load`)."""
    try:
        status, body = server.post("/v1/translate", {"text": texts})
    except Exception as e:
        return type(e).__name__
    if status == 200:
        return "200" if len(json.loads(body)["translations"]) == len(texts) else "200 wrong"
    if status == 503:
        clean = body.startswith(b"{") and "error" in json.loads(body)
        return "503 clean" if clean else "503 other"
    return str(status)

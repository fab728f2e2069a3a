"""A real `mtkit serve` process on a free loopback port, for the serving benchmarks and
tests: start it, wait until it answers, call it with the standard library, stop it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
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

"""`mtkit serve` as a real process under faults: SIGTERM with a long backlog, a client
that leaves mid-body. Each ends with exit 0, no traceback in the log, and every client
answered with a status that says what happened."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
from serverkit import LocalServer  # noqa: E402


def test_sigterm_under_a_backlog_finishes_a_round_answers_the_rest_503_and_exits_0(trained):
    """Shutdown's promise under load: 40 requests wait (one fits a round), SIGTERM comes
    once the server has them all; what is in flight is finished, the rest get 503 at
    once (they waited through translating all of it, then 500 and tracebacks), exit 0."""
    server = LocalServer(
        trained / "run" / "checkpoints" / "best.pt",
        "--max-wait-ms",
        "5",
        "--max-batch-tokens",
        "64",
        "--device",
        "cpu",
    )
    lines = [" ".join(["A man in a blue shirt is playing the guitar."] * 3)] * 8
    statuses: list = []

    def client() -> None:
        try:
            statuses.append(server.request("POST", "/v1/translate", {"text": lines})[0])
        except OSError as e:  # the connection was dropped: a broken promise
            statuses.append(repr(e))

    clients = [threading.Thread(target=client) for _ in range(40)]
    for c in clients:
        c.start()
    deadline = time.time() + 60
    while server.get("/v1/info")[1]["load"]["requests_received"] < 40:
        assert time.time() < deadline, "the requests never reached the server"
        time.sleep(0.02)
    code, err = server.stop()
    for c in clients:
        c.join(timeout=60)
    assert code == 0, err[-2000:]
    assert "Traceback" not in err and "InvalidStateError" not in err, err[-2000:]
    assert len(statuses) == 40 and set(statuses) <= {200, 503}, statuses
    assert 503 in statuses and 200 in statuses


def test_a_client_that_leaves_mid_body_is_no_traceback(trained):
    server = LocalServer(trained / "run" / "checkpoints" / "best.pt", "--device", "cpu")
    with socket.create_connection(("127.0.0.1", server.port)) as half:
        half.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b'application/json\r\nContent-Length: 1000\r\n\r\n{"text": ['
        )
    assert server.translate(["A dog."])[0]  # served on
    code, err = server.stop()
    assert code == 0 and "Traceback" not in err and "ClientDisconnect" not in err, err[-2000:]


def test_a_stop_signal_delivered_to_another_thread_still_stops_the_model_thread(trained):
    """The kernel may deliver a process's SIGTERM to any of its threads (the HTTP one, an
    executor's); the model thread, waiting for requests, must still run the handler."""
    checkpoint = str(trained / "run" / "checkpoints" / "best.pt")
    script = f"""
import signal, sys, threading
from mtkit.engines.loader import load_engine
from mtkit.serving.scheduler import Batcher, Limits
batcher = Batcher(load_engine({checkpoint!r}, "cpu"), Limits())
signal.signal(signal.SIGTERM, lambda s, f: batcher.close())
other = threading.Thread(target=threading.Event().wait, daemon=True)
other.start()
threading.Timer(1.0, signal.pthread_kill, (other.ident, signal.SIGTERM)).start()
batcher.run()  # waits for requests until the handler closes it
print("stopped")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-2000:]

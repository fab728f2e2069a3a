"""`mtkit serve` as a real process under faults: SIGTERM with a long backlog, a client
that leaves mid-body. Each ends with exit 0, no traceback in the log, and every client
answered with a status that says what happened."""

from __future__ import annotations

import select
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


JSON, FORM = "application/json", "application/x-www-form-urlencoded"
HALF_BODIES = [  # every route that reads a body, and both kinds the protocols take
    ("/v1/translate", JSON, b'{"text": ['),
    ("/translate", JSON, b'{"q": "A dog'),
    ("/translate", FORM, b"q=A+dog&sour"),
    ("/detect", FORM, b"q=A+d"),
    ("/v2/translate", JSON, b'{"text": ["A'),
    ("/v2/translate", FORM, b"text=A+dog&target_l"),
    ("/v2/languages", FORM, b"type=tar"),
]


def half_request(path: str, kind: str, part: bytes, length: int = 1000) -> bytes:
    """A POST's headers, announcing `length` bytes of body, and the `part` of it sent."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode() + part


def test_a_client_that_leaves_mid_body_is_no_traceback(trained):
    """On every route, JSON or a form: the client that leaves mid-body is no one to answer
    and no error to log (LibreTranslate's and DeepL's logged a ClientDisconnect)."""
    with LocalServer(trained / "run" / "checkpoints" / "best.pt", "--device", "cpu") as server:
        for path, kind, part in HALF_BODIES:
            with socket.create_connection(("127.0.0.1", server.port)) as half:
                half.sendall(half_request(path, kind, part))
        assert server.translate(["A dog."])[0]  # served on
        code, err = server.stop()
    assert code == 0 and "Traceback" not in err and "ClientDisconnect" not in err, err[-2000:]
    assert "Exception" not in err and "ERROR" not in err, err[-2000:]


def trickle(
    port: int,
    path: str,
    kind: str,
    body: bytes,
    answers: list,
    arriving: threading.Event | None = None,
) -> None:
    """Send a request's body a byte every 0.2 s (a slowloris) until the server answers or
    closes, and put what came back in `answers`; `arriving` is set once the headers and
    the first bytes of the body are sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        c.sendall(half_request(path, kind, b"", len(body)))
        try:
            for sent, byte in enumerate(body):
                if select.select([c], [], [], 0.2)[0]:  # answered before the body ended
                    break
                c.sendall(bytes([byte]))
                if arriving is not None and sent == 2:
                    arriving.set()
        except OSError:  # closed as it answered: the answer is still there to read
            pass
        got = b""
        try:
            while chunk := c.recv(4096):
                got += chunk
        except OSError as e:
            got = got or repr(e).encode()
        answers.append(got)


LT_BODY = b'{"q": "' + b"A dog runs. " * 12 + b'", "source": "en", "target": "de"}'
DEEPL_BODY = b'{"text": ["' + b"A dog runs. " * 12 + b'"], "target_lang": "DE"}'


def test_a_body_that_does_not_arrive_in_time_is_a_408_in_the_apis_shape(trained):
    """With --body-timeout 1, a body trickled over half a minute gets 408 after about a second (in
    each API's shape), and the connection is closed; others are served meanwhile."""
    server = LocalServer(
        trained / "run" / "checkpoints" / "best.pt", "--device", "cpu", "--body-timeout", "1"
    )
    with server:
        answers: list = []
        slow = [
            threading.Thread(
                target=trickle, args=(server.port, path, JSON, body, answers), daemon=True
            )
            for path, body in (("/translate", LT_BODY), ("/v2/translate", DEEPL_BODY))
        ]
        start = time.monotonic()
        for t in slow:
            t.start()
        assert server.translate(["A dog."])[0]
        for t in slow:
            t.join(timeout=60)
        assert time.monotonic() - start < 30  # (1 s and a poll; each body would take 37 s)
        lt, deepl = sorted(answers, key=lambda a: b"message" in a)
        for answer, key in ((lt, "error"), (deepl, "message")):
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
            assert (
                body
                == (
                    f'{{"{key}":"the request body did not arrive within 1 s (--body-timeout)"}}'
                ).encode()
            )
        code, err = server.stop()
        assert code == 0 and "Traceback" not in err, err[-2000:]


def test_sigterm_while_a_client_trickles_its_body_exits_within_seconds(trained):
    """Shutdown waits for no slow client: a body still arriving at SIGTERM (the default
    --body-timeout, 30 s) gets 503 two seconds later, and the server exits 0 (it waited
    out uvicorn's 60 s graceful timeout, or the whole body)."""
    with LocalServer(trained / "run" / "checkpoints" / "best.pt", "--device", "cpu") as server:
        answers: list = []
        arriving = threading.Event()
        slow = threading.Thread(
            target=trickle,
            args=(server.port, "/translate", JSON, LT_BODY, answers, arriving),
            daemon=True,
        )
        slow.start()
        assert arriving.wait(timeout=60)  # the body is arriving (for 37 s)
        start = time.monotonic()
        code, err = server.stop()
        assert time.monotonic() - start < 30, "shutdown waited for the slow client"
    slow.join(timeout=60)
    assert code == 0 and "Traceback" not in err and "ERROR" not in err, err[-2000:]
    assert answers and answers[0].startswith(b"HTTP/1.1 503 "), answers
    assert answers[0].endswith(b'{"error":"the server is shutting down; retry shortly"}')


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

"""Two `mtkit serve` replicas behind a real load balancer (Debian's haproxy, on loopback):
readiness gates traffic, and a replica stopped (SIGTERM) or killed (SIGKILL) mid-load
loses no request. Skipped where `haproxy` is not installed (`apt-get install haproxy`).
Uses the tiny trained run of tests/conftest.py."""

from __future__ import annotations

import http.client
import re
import shutil
import signal
import threading

import pytest

pytest.importorskip("fastapi")
if shutil.which("haproxy") is None:
    pytest.skip("needs haproxy (apt-get install haproxy)", allow_module_level=True)

from serverkit import Balancer, LocalServer, send_load, wait_ready  # noqa: E402

CLIENTS = 32
REQUESTS = 240
KILL_AFTER = 60  # answered requests before one replica is stopped
TEXTS = ["A dog runs in the park.", "Two men talk on a bench.", "A girl."]


def served(replica: LocalServer, route: str = "/v1/translate") -> float:
    """The requests `replica` has answered on `route` (its /metrics, any status)."""
    conn = http.client.HTTPConnection("127.0.0.1", replica.port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    pattern = rf'^mtkit_requests_total\{{route="{re.escape(route)}",status="\dxx"\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


@pytest.fixture
def replicas(trained):
    """Two ready replicas of the tiny model, started with `--drain-delay SECONDS`:
    after SIGTERM each goes on serving with /v1/ready at 503 that long, so that haproxy's
    checks (every 100 ms) take it out before its port closes."""
    started: list[LocalServer] = []

    def start(drain_delay: float) -> list[LocalServer]:
        checkpoint = trained / "run" / "checkpoints" / "best.pt"
        for _ in range(2):
            started.append(LocalServer(checkpoint, "--drain-delay", drain_delay, "--beam", "1"))
        for server in started:
            wait_ready(server)
        return started

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            # the second SIGTERM (`stop`'s) ends the drain delay once the first was
            # handled: two at once would be one to the kernel
            wait_unready(server)
        server.stop()


def wait_unready(server: LocalServer) -> None:
    for _ in range(1200):
        try:
            if server.get("/v1/ready")[0] != 200:
                return
        except OSError:  # already closed
            return
        threading.Event().wait(0.05)


def test_readiness_gates_traffic(replicas, tmp_path):
    first, second = replicas(drain_delay=600)  # draining outlasts the test
    with Balancer([first, second], tmp_path) as balancer:
        balancer.wait_states({"r0": "UP", "r1": "UP"})
        for _ in range(4):
            assert balancer.post("/v1/translate", {"text": TEXTS})[0] == 200
        assert served(first) == served(second) == 2  # round robin
        # the second starts draining: /v1/ready says 503, though it still serves
        second.proc.send_signal(signal.SIGTERM)
        balancer.wait_states({"r0": "UP", "r1": "DOWN"})
        assert second.get("/v1/ready")[0] == 503
        before = served(second)
        for _ in range(6):
            assert balancer.post("/v1/translate", {"text": TEXTS})[0] == 200
        assert served(second) == before  # not ready: none of them
        assert served(first) == 2 + 6
    second.proc.send_signal(signal.SIGTERM)  # a second signal ends the drain delay
    assert second.proc.wait(timeout=120) == 0


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_replica_stopped_mid_load_loses_no_request(replicas, tmp_path, stop):
    first, second = replicas(drain_delay=1)
    with Balancer([first, second], tmp_path) as balancer:
        balancer.wait_states({"r0": "UP", "r1": "UP"})
        outcomes = send_load(
            balancer,
            [TEXTS] * REQUESTS,
            CLIENTS,
            KILL_AFTER,
            lambda: second.proc.send_signal(stop),
            retry_cut=stop == signal.SIGKILL,  # (a response cut mid-body: the client's retry)
        )
        second.proc.wait(timeout=120)
        balancer.wait_states({"r0": "UP", "r1": "DOWN"})
        after = balancer.post("/v1/translate", {"text": TEXTS})
    print(f"{signal.Signals(stop).name}: {dict(outcomes)}")  # (the benchmark's counts)
    assert sum(outcomes.values()) == REQUESTS
    unanswered = [line for line in balancer.log.splitlines() if " 200 " not in line]
    answered = {"200", "503 clean", "cut, then 200", "cut, then 503 clean"}
    assert set(outcomes) <= answered, (outcomes, unanswered[-10:])  # none lost
    assert outcomes["200"] + outcomes["cut, then 200"] >= REQUESTS - CLIENTS  # (one 503 a client)
    if stop == signal.SIGTERM:
        assert not any(o.startswith("cut") for o in outcomes)  # a drain cuts no response
    assert after[0] == 200
    if stop == signal.SIGTERM:
        assert second.proc.returncode == 0  # drained and exited cleanly
    assert served(first) > 0

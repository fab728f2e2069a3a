"""`mtkit serve`: the API through FastAPI's test client, and a real server process on a
loopback port for concurrency, disconnects and shutdown. Uses the tiny trained run of
tests/conftest.py."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from dataclasses import replace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from mtkit.cli import app as cli_app  # noqa: E402
from mtkit.core.search_options import SearchOptions
from mtkit.engines.loader import load_engine  # noqa: E402
from mtkit.serving.app import create_app  # noqa: E402
from mtkit.serving.scheduler import Batcher, Limits

from conftest import assert_same_hypotheses  # noqa: E402
from serverkit import LocalServer  # noqa: E402

SENTENCES = [
    "A dog runs in the park.",
    "",
    "Two men talk on a bench.",
    "A girl.",
    "A man in a blue shirt is playing the guitar on a stage.",
]


@pytest.fixture(scope="module")
def translator(trained):
    return load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu")


def defaults(translator) -> SearchOptions:
    return SearchOptions.from_config(translator.config.decode)


def client(translator, **kw) -> TestClient:
    limits = Limits(**{k: v for k, v in kw.items() if k != "api_key"})
    return TestClient(
        create_app(translator, defaults(translator), limits, "best.pt", 20, kw.get("api_key"))
    )


def alone(translator, lines: list[str], **opts) -> list[str]:
    """What one-by-one offline translation gives, for comparison."""
    o = replace(defaults(translator), **opts)
    return [translator.tgt_vocab.decode(translator.translate([x], o)[0][0].tokens) for x in lines]


def test_translate_health_info_page_and_docs(translator):
    with client(translator) as api:
        assert api.get("/v1/health").json() == {"status": "ok", "model_loaded": True}
        info = api.get("/v1/info").json()
        assert (info["source_language"], info["target_language"], info["step"]) == ("en", "de", 20)
        assert info["parameters"] > 0 and info["decoding"]["beam"] == defaults(translator).beam
        assert info["weights"] == "step 20" and info["device"] == "cpu"
        assert info["load"] == {"requests_received": 0, "waiting_lines": 0}
        answer = api.post("/v1/translate", json={"text": SENTENCES}).json()
        texts = [t["text"] for t in answer["translations"]]
        assert texts == alone(translator, SENTENCES) and texts[1] == ""
        assert api.get("/v1/info").json()["load"] == {"requests_received": 1, "waiting_lines": 0}
        assert answer["model"] == "best.pt" and answer["elapsed_ms"] >= 0
        assert "alignment" not in answer["translations"][0]
        answer = api.post(
            "/v1/translate", json={"text": SENTENCES[:1], "alignments": True, "nbest": 2, "beam": 2}
        ).json()
        first = answer["translations"][0]
        assert len(first["nbest"]) == 2 and first["nbest"][0]["text"] == first["text"]
        assert first["alignment"] and all("-" in pair for pair in first["alignment"].split())
        assert api.post("/v1/translate", json={"text": []}).json()["translations"] == []
        page = api.get("/")
        assert page.status_code == 200 and "<textarea" in page.text
        assert "http://" not in page.text and "https://" not in page.text  # nothing fetched
        assert api.get("/docs").status_code == 200
        assert "/v1/translate" in api.get("/openapi.json").json()["paths"]


def test_v1_splits_a_text_of_several_sentences_as_the_python_api_does(translator):
    from mtkit.api import Translator

    paragraph = "A dog runs in the park. Two men talk on a bench."
    expected = Translator(translator).translate([paragraph, SENTENCES[3]], alignments=True)
    with client(translator) as api:
        answer = api.post(
            "/v1/translate", json={"text": [paragraph, SENTENCES[3]], "alignments": True}
        ).json()
        whole = api.post("/v1/translate", json={"text": [paragraph], "split": False}).json()
    split, single = answer["translations"]
    assert [s["source"] for s in split["sentences"]] == [
        "A dog runs in the park.",
        "Two men talk on a bench.",
    ]
    assert [s["text"] for s in split["sentences"]] == alone(translator, SENTENCES[0:3:2])
    assert split["text"] == expected[0].text == " ".join(alone(translator, SENTENCES[0:3:2]))
    assert split["alignment"] == " ".join(f"{s}-{t}" for s, t in expected[0].alignment)
    assert split["confidence"] == pytest.approx(expected[0].confidence, abs=1e-4)
    assert "sentences" not in single and single["text"] == expected[1].text
    unsplit = whole["translations"][0]
    assert "sentences" not in unsplit and unsplit["text"] == alone(translator, [paragraph])[0]


def test_an_api_key_guards_everything_but_health(translator):
    with client(translator, api_key="s3cret") as api:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for r in (
                api.get("/v1/info", headers=headers),
                api.post("/v1/translate", json={"text": ["A dog."]}, headers=headers),
            ):
                assert r.status_code == 401 and "API key" in r.json()["error"]
                assert r.headers["www-authenticate"] == "Bearer"
        assert api.get("/v1/health").status_code == 200
        good = {"Authorization": "Bearer s3cret"}
        assert api.post("/v1/translate", json={"text": ["A dog."]}, headers=good).status_code == 200


@pytest.mark.parametrize(
    "body, status, says, field",
    [
        (b"", 422, "the body is empty", None),
        (b'{"text": "A dog."}', 422, "text: Input should be a valid list", "text"),
        (b'{"text": ["A \xff dog."]}', 422, "not UTF-8", None),
        (b'{"text": ["A dog."], "beam": 0}', 422, "beam must be from 1 to 256, got 0", "beam"),
        (b'{"text": ["A dog."], "nbest": 0}', 422, "nbest must be from 1 to 256, got 0", "nbest"),
        (b'{"text": ["A dog."], "beam": 2, "nbest": 3}', 422, "nbest 3 must not exceed", "nbest"),
        (b'{"text": ["A dog."], "colour": 1}', 422, "colour: Extra inputs", "colour"),
        (b'{"text": [', 422, "not JSON", None),
        (json.dumps({"text": ["A dog."] * 5}).encode(), 413, "at most 4 texts", "text"),
        (json.dumps({"text": ["x" * 300]}).encode(), 413, "at most 200 characters", "text"),
        (b'{"text": ["' + b"a" * (10 << 20) + b'"]}', 413, "body is over", None),
    ],
)
def test_bad_requests_get_a_json_error_and_the_server_stays_up(
    translator, body, status, says, field
):
    with client(translator, max_lines=4, max_chars=200) as api:
        r = api.post("/v1/translate", content=body)
        assert r.status_code == status, r.text
        assert says in r.json()["error"] and r.json().get("field") == field
        assert api.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200


def test_the_worker_batches_concurrent_requests_and_answers_each_its_own(translator):
    calls = []
    real = translator.translate

    class Counting:
        def __getattr__(self, name):
            return getattr(translator, name)

        def translate(self, lines, opts, *args, **kw):
            calls.append(len(lines))
            return real(lines, opts, *args, **kw)

    batcher = Batcher(Counting(), Limits(max_wait_ms=300)).start()
    opts = defaults(translator)
    futures = [batcher.submit([x, x + " Again."], opts) for x in SENTENCES]
    results = [f.result(timeout=60) for f in futures]
    batcher.stop()
    assert calls == [2 * len(SENTENCES)]  # one search for all five requests
    for x, hyps in zip(SENTENCES, results):
        texts = [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]
        assert texts == alone(translator, [x, x + " Again."])


def test_requests_sent_as_a_round_is_answered_join_the_next_round(translator):
    """The wait for company counts from the end of the last round as well: a client
    answered by round 1 that comes back at once joins the request that waited through
    round 1, instead of that one leaving alone."""
    rounds, real = [], translator.translate

    class Slow:
        def __getattr__(self, name):
            return getattr(translator, name)

        def translate(self, lines, opts, *args, **kw):
            rounds.append(list(lines))
            if len(rounds) == 1:
                time.sleep(1.0)  # far longer than max_wait: "B" waits through it
            return real(lines, opts, *args, **kw)

    batcher = Batcher(Slow(), Limits(max_wait_ms=400)).start()
    opts = defaults(translator)
    first = batcher.submit(["A dog."], opts)
    while not rounds:  # round 1 ("A dog." alone, after waiting 400 ms) has started
        time.sleep(0.01)
    waiting = batcher.submit(["B cat."], opts)
    first.result(timeout=60)
    time.sleep(0.05)  # the answered client comes back, well within 400 ms
    again = batcher.submit(["C bird."], opts)
    waiting.result(timeout=60), again.result(timeout=60)
    batcher.stop()
    assert rounds == [["A dog."], ["B cat.", "C bird."]]


class Recording:
    """The translator, with the lines of each `translate` call (a round) recorded."""

    def __init__(self, translator):
        self.translator, self.rounds = translator, []

    def __getattr__(self, name):
        return getattr(self.translator, name)

    def translate(self, lines, opts, *args, **kw):
        self.rounds.append(list(lines))
        return self.translator.translate(lines, opts, *args, **kw)


def test_greedy_requests_join_one_running_search_and_get_what_alone_gives(translator):
    """Greedy requests go through the stream (continuous batching), never a round;
    empty lines and alignments come back as `translate` gives them (tokens and
    alignments exactly; scores within a tolerance, as the stream's batch differs from
    one sentence alone); a beam request sent meanwhile runs in a round of its own."""
    recording = Recording(translator)
    batcher = Batcher(recording, Limits(max_wait_ms=50)).start()
    greedy = replace(defaults(translator), beam=1, nbest=1)
    futures = [batcher.submit([x, x + " Again."], greedy) for x in SENTENCES]
    aligned = batcher.submit(SENTENCES[:1], replace(greedy, alignments=True))
    beam = batcher.submit(SENTENCES[:1], replace(greedy, beam=2))
    results = [f.result(timeout=60) for f in futures]
    batcher.stop()
    assert recording.rounds == [SENTENCES[:1]]  # the beam request alone
    for x, hyps in zip(SENTENCES, results):
        assert [translator.tgt_vocab.decode(h[0].tokens) for h in hyps] == alone(
            translator, [x, x + " Again."], beam=1
        )
    expected = translator.translate(SENTENCES[:1], replace(greedy, alignments=True))
    assert_same_hypotheses(aligned.result(timeout=60), expected)
    assert expected[0][0].alignment
    assert beam.result(timeout=60)[0][0].tokens
    assert_same_hypotheses(results[1][0], [translator.translate([""], greedy)[0][0]])  # empty


def test_stop_while_a_round_gathers_answers_it_and_returns(translator):
    """The stop signal that arrives while the worker waits for company is kept: the
    request is answered, then the worker returns (it once waited on the queue forever)."""
    batcher = Batcher(translator, Limits(max_wait_ms=2000)).start()
    future = batcher.submit(["A dog."], defaults(translator))
    time.sleep(0.2)  # the worker now waits for company
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(timeout=60)
    assert not stopper.is_alive() and future.result(timeout=1)[0][0].tokens


def test_a_request_whose_wait_is_cancelled_is_never_translated(translator):
    """A client gone (its future cancelled) while an earlier round runs: the worker drops
    its request untranslated and answers the others (setting a result on a cancelled
    future raised InvalidStateError in the worker)."""
    release = threading.Event()

    class Held(Recording):
        def translate(self, lines, opts, *args, **kw):
            release.wait(timeout=60)  # the first round holds the worker
            return super().translate(lines, opts, *args, **kw)

    held = Held(translator)
    batcher = Batcher(held, Limits(max_wait_ms=0, max_batch_tokens=1)).start()
    opts = defaults(translator)
    first = batcher.submit(["A dog."], opts)
    gone = batcher.submit(["B cat."], opts)
    later = batcher.submit(["C bird."], opts)
    assert gone.cancel()  # not begun: the worker is still in the first round
    release.set()
    assert first.result(timeout=60)[0][0].tokens and later.result(timeout=60)[0][0].tokens
    batcher.stop()
    assert held.rounds == [["A dog."], ["C bird."]]


def waiting_service(translator):
    """A `Service` whose batcher never starts (its requests wait), and the futures of the
    requests submitted to it, in order."""
    from mtkit.serving.app import Service

    batcher, submitted = Batcher(translator, Limits()), []
    real_submit = batcher.submit

    def submit(*args, **kwargs):
        submitted.append(real_submit(*args, **kwargs))
        return submitted[-1]

    batcher.submit = submit
    service = Service(translator, defaults(translator), Limits(), "m")
    service.start(batcher)
    return service, submitted


def test_a_waiting_handler_whose_client_left_cancels_its_request(translator):
    class Gone:
        async def is_disconnected(self) -> bool:
            return True

    service, submitted = waiting_service(translator)
    found = asyncio.run(service.translated(Gone(), ["A dog."], defaults(translator)))
    assert found is None and len(submitted) == 1 and submitted[0].cancelled()


def test_without_continuous_batching_greedy_requests_run_in_rounds(translator):
    recording = Recording(translator)
    batcher = Batcher(recording, Limits(max_wait_ms=300), continuous=False).start()
    greedy = replace(defaults(translator), beam=1, nbest=1)
    futures = [batcher.submit([x], greedy) for x in SENTENCES]
    results = [f.result(timeout=60)[0][0] for f in futures]
    batcher.stop()
    assert recording.rounds == [SENTENCES]
    assert [translator.tgt_vocab.decode(h.tokens) for h in results] == alone(
        translator, SENTENCES, beam=1
    )


def test_stop_finishes_the_streaming_requests_and_a_failed_step_answers_each(
    translator, monkeypatch
):
    from mtkit.serving.stream import LineStream

    greedy = replace(defaults(translator), beam=1, nbest=1)
    real_step, failures = LineStream.step, []

    def step(self):
        if not failures:
            failures.append(1)
            raise RuntimeError("out of memory")
        return real_step(self)

    monkeypatch.setattr(LineStream, "step", step)
    batcher = Batcher(translator, Limits(max_wait_ms=50)).start()
    failed = [batcher.submit(SENTENCES[:2], greedy), batcher.submit(SENTENCES[2:], greedy)]
    for f in failed:  # both were in the stream when its step failed
        with pytest.raises(RuntimeError, match="out of memory"):
            f.result(timeout=60)
    later = [batcher.submit([x], greedy) for x in SENTENCES]
    batcher.stop()  # returns once the stream is empty
    assert all(f.done() for f in later)
    assert [f.result()[0][0].tokens for f in later] == [
        translator.translate([x], greedy)[0][0].tokens for x in SENTENCES
    ]


# --- a real server process -------------------------------------------------------------


@pytest.fixture
def server(trained, request):
    flags = getattr(request, "param", [])
    s = LocalServer(
        trained / "run" / "checkpoints" / "best.pt",
        "--max-wait-ms",
        "20",
        "--device",
        "cpu",
        *flags,
    )
    yield s
    s.stop()


@pytest.mark.parametrize(
    "server, beam",
    [([], None), ([], 1), (["--rounds"], 1)],
    ids=["default beam", "greedy, continuous", "greedy, --rounds"],
    indirect=["server"],
)
def test_concurrent_clients_get_what_one_by_one_translation_gives(server, translator, beam):
    requests = [SENTENCES[i % 5 : i % 5 + 1 + i % 3] for i in range(24)]
    answers: dict[int, list[str]] = {}
    extra = {"beam": beam} if beam else {}

    def client_thread(i: int) -> None:
        answers[i] = server.translate(requests[i], **extra)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = dict(zip(SENTENCES, alone(translator, SENTENCES, **extra)))
    assert all(answers[i] == [expected[x] for x in requests[i]] for i in range(24))


def test_slow_and_vanishing_clients_do_not_hold_up_others(server):
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        b'\r\nContent-Length: 1000\r\n\r\n{"text": ["A do'
    )  # and no more
    start = time.perf_counter()
    assert server.translate(["A dog."])[0]  # answered while the slow body is pending
    assert time.perf_counter() - start < 30
    slow.close()  # the slow client leaves mid-request
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # leaves before its answer
        s.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n"
            b'{"text": ["A dog runs in the park."]}'
        )
    assert server.translate(["A dog."])[0]
    assert server.proc.poll() is None


def test_the_queue_is_bounded_and_refuses_with_503(translator):
    from mtkit.serving.scheduler import ServeError

    batcher = Batcher(translator, Limits(max_queued_lines=6))  # not started: nothing leaves
    opts = defaults(translator)
    batcher.submit(["A dog."] * 4, opts)
    with pytest.raises(ServeError, match="busy") as refused:
        batcher.submit(["A cat."] * 3, opts)
    assert refused.value.status == 503
    batcher.submit(["A cat."] * 2, opts)  # what still fits is taken


def test_the_api_key_can_come_from_the_environment(trained):
    with LocalServer(
        trained / "run" / "checkpoints" / "best.pt", "--device", "cpu", env={"MTKIT_API_KEY": "k3y"}
    ) as server:
        assert server.request("GET", "/v1/info")[0] == 401
        status, info = server.request("GET", "/v1/info", headers={"Authorization": "Bearer k3y"})
        assert status == 200 and info["step"] == 20


def test_sigterm_finishes_the_requests_in_flight_then_exits_0(trained):
    server = LocalServer(
        trained / "run" / "checkpoints" / "best.pt", "--max-wait-ms", "1500", "--device", "cpu"
    )
    answer: list = []
    slow = threading.Thread(
        target=lambda: answer.append(server.request("POST", "/v1/translate", {"text": SENTENCES}))
    )
    slow.start()
    deadline = time.time() + 60  # the request is in; it waits for company (1.5 s)
    while server.get("/v1/info")[1]["load"]["requests_received"] < 1:
        assert time.time() < deadline, "the request never reached the server"
        time.sleep(0.02)
    code, err = server.stop()
    slow.join()
    assert code == 0, err
    assert answer and answer[0][0] == 200 and len(answer[0][1]["translations"]) == 5
    with pytest.raises(OSError):
        server.get("/v1/health")


def test_without_the_extra_serve_says_what_to_install(trained, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # import fastapi -> ImportError
    result = CliRunner().invoke(
        cli_app, ["serve", "-m", str(trained / "run" / "checkpoints" / "best.pt")]
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: mtkit serve needs FastAPI and uvicorn: pip install 'mtkit[serve]'"
    )


def test_a_cors_origin_that_no_browser_sends_is_refused_in_one_line(trained):
    result = CliRunner().invoke(
        cli_app,
        [
            "serve",
            "-m",
            str(trained / "run" / "checkpoints" / "best.pt"),
            "--cors-origin",
            "example.org",
        ],
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --cors-origin must be '*' or an origin such as https://example.org (a "
        "scheme and a host, in lower case, with no path), got 'example.org'"
    )


def test_every_waiting_request_reaches_the_batcher_at_once(translator):
    """Forty requests at once are forty in the batcher, to be batched together. Their
    sessions ran in asyncio's default pool, of min(32, cores + 4) threads: on two cores
    the batcher saw six, the rest waited unseen (the server answered 52 one-sentence
    requests a second to 48 clients, 121 with a pool of its own)."""

    class Here:
        async def is_disconnected(self) -> bool:
            return False

    service, submitted = waiting_service(translator)
    batcher = service.batcher

    async def forty() -> int:
        opts = defaults(translator)
        waiting = [
            asyncio.ensure_future(service.translated(Here(), [f"A dog {k}."], opts))
            for k in range(40)
        ]
        for _ in range(600):  # (30 s at most)
            if batcher.received == 40:
                break
            await asyncio.sleep(0.05)
        received = batcher.received
        batcher.close()  # any later request is answered 503 at once
        for future in submitted:  # and these are dropped: every session ends
            future.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return received

    assert asyncio.run(forty()) == 40
    service.sessions.shutdown()


@pytest.mark.parametrize("given", ["0", "-1", "nan", "3601"])
def test_a_body_timeout_out_of_range_is_refused_in_one_line(trained, given):
    result = CliRunner().invoke(
        cli_app,
        ["serve", "-m", str(trained / "run" / "checkpoints" / "best.pt"), "--body-timeout", given],
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: --body-timeout must be above 0 and at most 3,600, got {float(given)}"
    )

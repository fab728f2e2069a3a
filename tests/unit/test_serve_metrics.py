"""A server for replicas: /v1/ready (503 until the warm-up search has run, 503 again while
draining) and /metrics (`mtkit.serving.metrics`) through FastAPI's test client, on the
random tiny engine of tests/conftest.py."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
prometheus = pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.serving import metrics as metrics_module  # noqa: E402
from mtkit.serving.app import WARM_UP_TEXT, create_app  # noqa: E402
from mtkit.serving.scheduler import SHUTTING_DOWN, Batcher, Limits  # noqa: E402

from conftest import cli, one_line_error  # noqa: E402

SECRET_TEXT = "Ein geheimer Satz über Kühe."
KEY = "s3cret-key"


class HeldEngine:
    """`engine` whose searches wait until `go` is set, and that records the lines of
    each (so a test sees the warm-up run and holds it)."""

    def __init__(self, engine):
        self.engine, self.go, self.searched = engine, threading.Event(), []
        self.encode, self.batch_tokens = engine.encode, engine.batch_tokens

    def translate(self, lines, *args, **kwargs):
        self.searched.append(list(lines))
        self.go.wait(timeout=60)
        return self.engine.translate(lines, *args, **kwargs)


def app_with(engine, batcher=None, api_key=None):
    defaults = SearchOptions.from_config(engine.config.decode)
    return create_app(engine, defaults, Limits(), "tiny", 0, api_key, batcher, load_seconds=1.5)


def samples(api: TestClient) -> dict[tuple[str, tuple], float]:
    """The scrape, parsed by prometheus-client's own parser: {(sample name, labels): value}."""
    answer = api.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def wait_ready(api: TestClient) -> None:
    for _ in range(600):  # the warm-up search of a tiny model: well under a second
        if api.get("/v1/ready").status_code == 200:
            return
        threading.Event().wait(0.05)
    raise AssertionError("never ready")


def test_ready_is_503_until_the_warm_up_search_ran_then_200_then_503_while_draining(tiny_engine):
    held = HeldEngine(tiny_engine)
    batcher = Batcher(held, Limits(), continuous=False).start()  # rounds: `translate` runs
    with TestClient(app_with(tiny_engine, batcher, api_key=KEY)) as api:
        for _ in range(600):  # the warm-up search reaches the engine, and waits there
            if held.searched:
                break
            threading.Event().wait(0.05)
        assert held.searched == [[WARM_UP_TEXT]]
        before = api.get("/v1/ready")  # no key: a probe has none
        assert before.status_code == 503
        assert before.json() == {
            "error": "not ready: the model is loading and warming up; retry shortly"
        }
        assert api.get("/v1/health").json() == {"status": "ok", "model_loaded": True}
        assert samples(api)[("mtkit_ready", ())] == 0.0
        held.go.set()
        wait_ready(api)
        assert api.get("/v1/ready").json() == {"status": "ready"}
        scraped = samples(api)
        assert scraped[("mtkit_ready", ())] == 1.0
        assert scraped[("mtkit_warmup_seconds", ())] > 0
        assert scraped[("mtkit_model_load_seconds", ())] == 1.5
        assert api.get("/v1/info", headers={"Authorization": f"Bearer {KEY}"}).json()["load"] == {
            "requests_received": 0,  # the warm-up is not a client's request
            "waiting_lines": 0,
        }
        api.app.state.service.draining = True  # what SIGTERM does first (`serve_forever`)
        draining = api.get("/v1/ready")
        assert (draining.status_code, draining.json()) == (503, {"error": SHUTTING_DOWN})
        assert api.get("/v1/health").status_code == 200  # still alive
        ok = api.post(
            "/v1/translate", json={"text": ["A dog."]}, headers={"Authorization": f"Bearer {KEY}"}
        )
        assert ok.status_code == 200  # draining still serves until the batcher closes
        api.app.state.service.draining = False
        batcher.close()  # the batcher closed (the drain delay over): 503 too
        assert api.get("/v1/ready").status_code == 503


def test_metrics_count_requests_by_route_template_and_status_class(tiny_engine):
    with TestClient(app_with(tiny_engine)) as api:
        wait_ready(api)
        first = samples(api)
        assert first[("mtkit_batches_total", ())] == 1  # the warm-up
        for _ in range(3):
            answer = api.post("/v1/translate", json={"text": [SECRET_TEXT, "Ein Hund."]})
            assert answer.status_code == 200
        assert api.post("/v1/translate", json={"text": "not a list"}).status_code == 422
        assert api.get("/no/such/" + SECRET_TEXT).status_code == 404
        assert api.get("/v1/" + KEY).status_code == 404
        scraped = samples(api)
    requests = {
        dict(labels)["route"] + " " + dict(labels)["status"]: value
        for (name, labels), value in scraped.items()
        if name == "mtkit_requests_total"
    }
    assert requests["/v1/translate 2xx"] == 3
    assert requests["/v1/translate 4xx"] == 1
    assert requests["other 4xx"] == 2  # unknown paths share one label
    assert requests["/v1/ready 2xx"] >= 1 and requests["/metrics 2xx"] == 1
    assert scraped[("mtkit_request_seconds_count", (("route", "/v1/translate"),))] == 4
    assert scraped[("mtkit_translated_sentences_total", ())] == 1 + 6  # the warm-up's, and 3 x 2
    assert scraped[("mtkit_translated_tokens_total", ())] > 0
    batches = scraped[("mtkit_batches_total", ())]
    assert 2 <= batches <= 4  # (the stream may take a request's two sentences with another's)
    assert scraped[("mtkit_batch_sentences_count", ())] == batches
    assert scraped[("mtkit_batch_sentences_sum", ())] == 7
    assert scraped[("mtkit_batch_tokens_sum", ())] > 7
    assert scraped[("mtkit_queue_sentences", ())] == 0
    labels = {(key, value) for (_, pairs) in scraped for key, value in pairs if key != "le"}
    routes = {r.path for r in api.app.routes} | {metrics_module.OTHER_ROUTE}
    assert {key for key, _ in labels} == {"route", "status"}
    assert {v for k, v in labels if k == "route"} <= routes
    assert {v for k, v in labels if k == "status"} <= {"2xx", "4xx", "5xx"}
    assert not any(SECRET_TEXT in v or "Hund" in v or KEY in v for _, v in labels)


def test_each_app_has_its_own_registry(tiny_engine):
    with TestClient(app_with(tiny_engine)) as one, TestClient(app_with(tiny_engine)) as two:
        wait_ready(one)
        one.post("/v1/translate", json={"text": ["A dog."]})
        counted = samples(one)
        assert counted[("mtkit_requests_total", (("route", "/v1/translate"), ("status", "2xx")))]
        assert ("mtkit_requests_total", (("route", "/v1/translate"), ("status", "2xx"))) not in (
            samples(two)
        )


def test_without_prometheus_client_metrics_says_what_to_install_and_the_rest_serves(
    tiny_engine, monkeypatch
):
    monkeypatch.setattr(metrics_module, "CollectorRegistry", None)
    with TestClient(app_with(tiny_engine)) as api:
        answer = api.get("/metrics")
        assert (answer.status_code, answer.text) == (
            501,
            "metrics need prometheus-client: pip install 'mtkit[metrics]'\n",
        )
        wait_ready(api)
        assert api.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200


@pytest.mark.parametrize("seconds", ["-1", "601", "nan"])
def test_a_drain_delay_out_of_range_is_one_line(tmp_path, seconds):
    result = cli("serve", "-m", tmp_path / "none.pt", "--drain-delay", seconds)
    one_line_error(result, f"--drain-delay must be from 0 to 600, got {float(seconds)}")

"""The deployment recipe under deploy/ (Kubernetes manifests, a systemd unit, haproxy's
config), checked for shape against the server it runs: its probes ask routes the app has,
on the port it listens on, with options `mtkit serve` takes, and its stop timeouts cover
the drain. (No container is built here; tests/e2e/test_replicas.py runs the haproxy
config for real.)"""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fastapi")
import typer  # noqa: E402

from mtkit.cli import app as cli_app  # noqa: E402
from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.serving.app import GRACEFUL_SHUTDOWN_S, create_app  # noqa: E402
from mtkit.serving.scheduler import Limits  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(scope="module")
def get_routes(tiny_engine) -> set[str]:
    app = create_app(
        tiny_engine, SearchOptions.from_config(tiny_engine.config.decode), Limits(), "tiny"
    )
    return {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}


def serve_options(args: list[str]) -> dict[str, str]:
    """`mtkit serve ARGS` parsed by the CLI's own command: {option: value}; a name it
    does not take fails the test."""
    serve = typer.main.get_command(cli_app).commands["serve"]
    context = serve.make_context("serve", list(args), resilient_parsing=False)
    given = {}
    for param in serve.params:
        for opt in param.opts:
            if opt in args:
                given[opt] = args[args.index(opt) + 1]
    assert context.params["model"], args
    return given


def test_the_kubernetes_probes_ask_the_servers_routes_on_its_port(get_routes):
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "mtkit.yaml").read_text()))
    kinds = {d["kind"]: d for d in documents}
    assert set(kinds) == {"Deployment", "Service"}
    deployment = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] >= 2
    assert (
        deployment["spec"]["selector"]["matchLabels"]
        == (deployment["spec"]["template"]["metadata"]["labels"])
    )
    (container,) = pod["containers"]
    assert container["args"][0] == "serve"
    options = serve_options(container["args"][1:])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": int(options["--port"])} and options["--host"] == "0.0.0.0"
    probes = {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert probes == {
        "livenessProbe": ("/v1/health", "http"),
        "readinessProbe": ("/v1/ready", "http"),
        "startupProbe": ("/v1/health", "http"),
    }
    assert {"/v1/health", "/v1/ready", "/metrics"} <= get_routes
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in get_routes
    assert int(annotations["prometheus.io/port"]) == ports["http"]
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # the pod is given the time its stop takes: preStop, the drain delay, the requests
    # in flight
    needed = float(pre_stop[1]) + float(options["--drain-delay"]) + GRACEFUL_SHUTDOWN_S
    assert pod["terminationGracePeriodSeconds"] >= needed
    service = kinds["Service"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_the_systemd_unit_runs_replicas_that_haproxy_checks_for_readiness(get_routes):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((DEPLOY / "systemd" / "mtkit-serve@.service").read_text())
    command = shlex.split(unit["Service"]["ExecStart"])
    assert command[0].endswith("/mtkit") and command[1] == "serve"
    assert command[command.index("--port") + 1] == "808%i"  # replica N on port 808N
    options = serve_options([c.replace("%i", "1") for c in command[2:]])
    stop = float(unit["Service"]["TimeoutStopSec"])
    assert stop >= float(options["--drain-delay"]) + GRACEFUL_SHUTDOWN_S
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    haproxy = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert re.findall(r"option httpchk GET (\S+)", haproxy) == ["/v1/ready"]
    assert "/v1/ready" in get_routes
    servers = re.findall(r"^\s+server \S+ 127\.0\.0\.1:(\d+) check", haproxy, re.M)
    assert servers == ["8081", "8082"]  # mtkit-serve@1 and @2
    assert re.search(r"^\s+retry-on .*conn-failure.*empty-response.*503", haproxy, re.M)
    assert re.search(r"^\s+option redispatch", haproxy, re.M)

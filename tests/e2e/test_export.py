"""`mtkit export --to ctranslate2` and `mtkit translate -m DIR` through the CLI, on the
tiny trained run of tests/conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ctranslate2")
from conftest import cli, one_line_error  # noqa: E402

LINES = "A dog runs in the park.\n\nTwo men talk on a bench.\nA girl.\n"


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export") / "ct2"
    result = cli("export", "-m", trained / "run" / "checkpoints" / "best.pt", "-o", folder)
    assert result.exit_code == 0, result.output
    return folder


def test_the_export_is_self_contained(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"model.bin", "config.json", "mtkit.json", "source.spm", "target.spm"} <= names
    manifest = json.loads((exported / "mtkit.json").read_text())
    assert manifest["step"] == 20 and manifest["config"]["decode"]["beam"] >= 1
    assert not [p for p in exported.parent.iterdir() if p.name.startswith(".")]  # no leftovers


def test_an_export_translates_without_loading_torch(exported):
    # In a fresh process (this one has torch loaded): the whole CLI path of -m DIR.
    code = (
        "import sys, io; sys.argv = ['mtkit', 'translate', '-m', sys.argv[1]]\n"
        "from mtkit.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('torch' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(exported)],
        input="A dog.\n\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "False"
    assert len(done.stdout.splitlines()) == 2 and done.stdout.splitlines()[0]


def test_translating_an_export_keeps_the_native_line_guarantees(exported, trained):
    best = trained / "run" / "checkpoints" / "best.pt"
    for extra in ([], ["--beam", "1"], ["--nbest", "2", "--beam", "3"], ["--scores"]):
        native = cli("translate", "-m", best, "--device", "cpu", *extra, input=LINES)
        ours = cli("translate", "-m", exported, "--device", "cpu", *extra, input=LINES)
        assert ours.exit_code == 0, ours.output
        rows = ours.stdout.splitlines()
        assert len(rows) == len(native.stdout.splitlines()) == 4 * (2 if "--nbest" in extra else 1)
        if "--beam" in extra and "1" in extra:  # greedy: the same search, the same outputs
            assert rows == native.stdout.splitlines()
    empty = cli("translate", "-m", exported, input="\n\n")
    assert empty.exit_code == 0 and empty.stdout == "\n\n"
    records = [
        json.loads(x)
        for x in cli(
            "translate", "-m", exported, "--format", "jsonl", input='{"src": "A dog.", "id": 3}\n'
        ).stdout.split("\n")
        if x
    ]
    assert records[0]["id"] == 3 and records[0]["translation"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--sampling"], "--sampling needs a checkpoint"),
        (["--alignments"], "--alignments needs a checkpoint"),
        (["--precision", "bf16"], "--precision bf16 needs a checkpoint"),
        (["--precision", "int8"], "--precision int8 needs a checkpoint"),
    ],
)
def test_what_the_export_cannot_do_is_refused(exported, args, says):
    result = cli("translate", "-m", exported, *args, input="A dog.\n")
    one_line_error(result, says)
    assert result.stdout == ""


def test_export_faults_are_one_line_and_leave_no_folder(trained, tmp_path, exported, monkeypatch):
    best = trained / "run" / "checkpoints" / "best.pt"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    one_line_error(cli("export", "-m", best, "-o", busy), "exists and is not empty; add --force")
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    broken = tmp_path / "broken.pt"
    broken.write_bytes(best.read_bytes()[:5000])
    one_line_error(cli("export", "-m", broken, "-o", tmp_path / "out"), "not a readable")
    import ctranslate2

    unsupported = sorted(
        {"bfloat16", "float16", "int8_float16"} - ctranslate2.get_supported_compute_types("cpu")
    )
    if unsupported:
        one_line_error(
            cli("export", "-m", best, "-o", tmp_path / "out", "--quantization", unsupported[0]),
            "is not supported on this CPU",
        )
    one_line_error(
        cli("translate", "-m", tmp_path, input="A dog.\n"), "is a folder but not an exported model"
    )
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.pt", "busy"]
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    one_line_error(cli("export", "-m", best, "-o", tmp_path / "out"), "pip install 'mtkit[ct2]'")
    one_line_error(cli("translate", "-m", exported, input="A dog.\n"), "pip install 'mtkit[ct2]'")


def test_int8_export_translates(trained, tmp_path):
    folder = tmp_path / "int8"
    result = cli(
        "export",
        "-m",
        trained / "run" / "checkpoints" / "best.pt",
        "-o",
        folder,
        "--quantization",
        "int8",
    )
    assert result.exit_code == 0, result.output
    out = cli("translate", "-m", folder, input=LINES)
    assert out.exit_code == 0 and len(out.stdout.splitlines()) == 4


def test_an_export_is_served_and_what_it_cannot_do_is_refused(exported):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.ct2 import CT2Engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    translator = CT2Engine(exported, "cpu")
    defaults = SearchOptions.from_config(translator.config.decode)
    with TestClient(create_app(translator, defaults, Limits(), "ct2", 20)) as api:
        info = api.get("/v1/info").json()
        assert info["engine"] == "ctranslate2 (float32)" and info["parameters"] is None
        answer = api.post("/v1/translate", json={"text": ["A dog.", ""]})
        assert answer.status_code == 200
        assert [t["text"] for t in answer.json()["translations"]][1] == ""
        refused = api.post("/v1/translate", json={"text": ["A dog."], "alignments": True})
        assert refused.status_code == 422 and refused.json()["field"] == "alignments"
        assert api.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200
    one_line_error(cli("serve", "-m", exported, "--sampling"), "--sampling needs a checkpoint")
    one_line_error(
        cli("serve", "-m", exported, "--align-layer", "0"), "--align-layer needs a checkpoint"
    )

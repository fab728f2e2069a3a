"""Every fault is one line (or one JSON error), never a traceback or a 500:
bad jsonl lines are error records and the stream goes on, bad request bodies are 422
naming the field, serve options out of range (and an empty API key) are refused at
start, explain refuses an exported folder, extreme decoding values work or are refused
naming the range, and counts agree with their noun ("1 line")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from faultkit import ROOT, assert_one_line, cli, snapshot

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000
# (a jsonl line, what its error record says)
BAD_LINES = [
    ('{"src": "a \\ud800"}', "src: a lone surrogate \\ud800"),
    ('{"src": "a", "prefix": "\\udc00"}', "prefix: a lone surrogate \\udc00"),
    (DEEP, "nested too deeply"),
    ('{"src": "a", "x": ' + DEEP + "}", "nested too deeply"),
    ('{"src": "a", "id": ' + HUGE + "}", "too many digits"),
    ('{"src": "a", "id": ' + "9" * 40 + "}", "id: an integer of at most 64 bits"),
    ('{"src": "a", "id": {"a": [1, {"b": 2}]}}', "id: text, a number or null, got dict"),
    ('{"src": "a", "id": ' + "[" * 500 + "]" * 500 + "}", "id: text, a number or null"),
    ('{"src": "a", "id": true}', "id: text, a number or null, got bool"),
    ('{"src": "a", "id": "' + "x" * 1001 + '"}', "id: text of at most 1000 characters"),
    ('{"src": "a", "id": "\\ud800"}', "id: a lone surrogate"),
    ('{"\\ud800": 1}', "a field's name holds a lone surrogate \\ud800"),
    ('{"src": "a", "prefx": "Ein"}', "prefx: no such field; did you mean prefix? the fields are"),
    ('{"src": "a", "split": false}', "split: no such field; the fields are src, prefix,"),
]


@pytest.fixture
def best(work):
    return work / "run" / "checkpoints" / "best.pt"


# 1. jsonl: each bad line is an error record for that line, and the stream goes on


def test_jsonl_bad_lines_are_error_records_and_the_stream_goes_on(work, best):
    good = '{"src": "A dog runs in the park.", "id": "g"}'
    lines = [good]
    for line, _ in BAD_LINES:
        lines += [line, good]
    before = snapshot(work)
    result = cli("translate", "-m", best, "--format", "jsonl", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and not result.stderr.strip()
    records = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(records) == len(lines)
    assert [r["line"] for r in records] == list(range(len(lines)))
    for k, (_, says) in enumerate(BAD_LINES):
        error, after = records[2 * k + 1], records[2 * k + 2]
        assert says in error["error"], (says, error)
        assert "id" not in error or error["id"] is None or isinstance(error["id"], (str, int))
        assert after["id"] == "g" and after["translation"]
    assert records[0]["translation"] == records[-1]["translation"]
    assert snapshot(work) == before


def test_jsonl_bad_lines_on_an_export_are_error_records_too(exported):
    good = '{"src": "A dog runs in the park."}'
    lines = [good]
    for line, _ in BAD_LINES:
        lines += [line, good]
    result = cli("translate", "-m", exported, "--format", "jsonl", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and not result.stderr.strip()
    records = [json.loads(x) for x in result.stdout.splitlines()]
    assert len(records) == len(lines)
    for k, (_, says) in enumerate(BAD_LINES):
        assert says in records[2 * k + 1]["error"], (says, records[2 * k + 1])
        assert records[2 * k + 2]["translation"]


def test_jsonl_good_ids_are_echoed(best):
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        input='{"src": "A dog.", "id": 9223372036854775807}\n'
        '{"src": "A dog.", "id": 1.5}\n{"src": "A dog.", "id": "\\u00e9"}\n',
    )
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["id"] for x in result.stdout.splitlines()] == [2**63 - 1, 1.5, "é"]


# 2. serve: the same bodies are 422 naming the field, never 500


@pytest.fixture(scope="module")
def api(trained):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    translator = load_engine(trained / "run" / "checkpoints" / "best.pt", "cpu")
    app = create_app(
        translator, SearchOptions.from_config(translator.config.decode), Limits(), "best.pt", 20
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ('{"text": ["a \\ud800"]}', "text.0", "lone surrogate \\ud800"),
        ('{"text": ["A dog.", "\\udfff b"]}', "text.1", "lone surrogate \\udfff"),
        ('{"text": ' + DEEP + "}", None, "nested too deeply"),
        ('{"text": [' + "[" * 500 + "]" * 500 + "]}", "text.0", "valid string"),
        ('{"text": ["a"], "beam": ' + HUGE + "}", None, "too many digits"),
        ('{"text": ["a"], "beam": ' + "9" * 40 + "}", "beam", "beam must be from 1 to 256"),
        ('{"text": ["a"], "beam": 1e20}', "beam", "valid integer"),
        ('{"text": ["a"], "nbest": 1e20}', "nbest", "valid integer"),
        ('{"text": ["a"], "nbest": -1}', "nbest", "nbest must be from 1 to 256, got -1"),
        ('{"text": ["a"], "id": {"a": [1, {"b": 2}]}}', "id", "Extra inputs"),
        ('{"text": ["a"], "\\ud800": 1}', None, "a field name holds a lone surrogate \\ud800"),
    ],
    ids=[
        "surrogate",
        "surrogate-2nd",
        "deep",
        "deep-text",
        "5000-digits",
        "huge-beam",
        "float-beam",
        "float-nbest",
        "negative-nbest",
        "object-id",
        "surrogate-key",
    ],
)
def test_serve_bad_bodies_are_422_naming_the_field(api, body, field, says):
    answer = api.post(
        "/v1/translate", content=body.encode(), headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert says in error["error"], error
    assert error.get("field") == field, error
    assert api.post("/v1/translate", json={"text": ["A dog."]}).status_code == 200


# 3. serve options out of range are refused at start, in one line


def serve_refused(*args, env: dict | None = None) -> str:
    """`mtkit serve ARGS` as a process (a server that starts anyway is killed after 60 s):
    exit 2 and one stderr line without a traceback; returns the line."""
    pytest.importorskip("fastapi")
    proc = subprocess.run(
        [sys.executable, "-m", "mtkit", "serve", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--max-wait-ms", "inf", "--max-wait-ms must be from 0 to 60,000, got inf"),
        ("--max-wait-ms", "nan", "--max-wait-ms must be from 0 to 60,000, got nan"),
        ("--max-wait-ms", "-1", "--max-wait-ms must be from 0"),
        ("--port", "99999", "--port must be from 1 to 65535, got 99999"),
        ("--port", "-1", "--port must be from 1 to 65535, got -1"),
        ("--port", "0", "--port must be from 1 to 65535"),
        ("--max-wait-ms", "1e300", "--max-wait-ms must be from 0 to 60,000, got 1e+300"),
        ("--max-lines", "0", "--max-lines must be above 0, got 0"),
    ],
)
def test_serve_options_out_of_range_are_refused_at_start(work, best, option, value, says):
    before = snapshot(work)
    assert says in serve_refused("-m", best, option, value)
    assert snapshot(work) == before


# 4. explain needs a checkpoint: an exported folder is one line


@pytest.mark.parametrize(
    "args", [["params"], ["shapes"], ["attention", "--src", "A dog.", "-o", "maps"]]
)
def test_explain_refuses_an_exported_folder_in_one_line(exported, tmp_path, monkeypatch, args):
    if args[0] == "attention":
        pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    before = snapshot(exported)
    assert_one_line(
        cli("explain", args[0], "-m", exported, *args[1:]),
        says=f"explain needs a checkpoint (-m FILE.pt): {exported} is an exported "
        f"CTranslate2 folder",
    )
    assert_one_line(
        cli("explain", args[0], "-m", tmp_path, *args[1:]),
        says="explain needs a checkpoint (-m FILE.pt)",
    )
    assert snapshot(exported) == before
    assert not (tmp_path / "maps").exists()


# 5. extreme decoding values: they work (a tiny temperature or top-p is greedy) or are
# refused in one line naming the option and its range


@pytest.mark.parametrize(
    "extreme",
    [
        ["--topp", "1e-38"],
        ["--topp", "1e-45"],
        ["--temperature", "1e-30"],
        ["--temperature", "1e-300"],
        ["--temperature", "1e-300", "--topp", "1e-38"],
    ],
)
def test_a_tiny_temperature_or_top_p_samples_the_most_likely_token(work, best, extreme):
    text = "A dog runs in the park.\n\nTwo men talk on a bench.\n"
    greedy = cli("translate", "-m", best, "--beam", "1", input=text)
    assert greedy.exit_code == 0, greedy.output
    before = snapshot(work)
    result = cli("translate", "-m", best, "--sampling", "--beam", "1", *extreme, input=text)
    assert result.exit_code == 0, result.output
    assert result.stdout == greedy.stdout and not result.stderr.strip()
    assert snapshot(work) == before


def test_extreme_sampling_values_with_several_samples_translate_every_line(work, best):
    (work / "in.txt").write_text("A dog.\nTwo men.\n")
    result = cli(
        "translate", "-m", best, "-i", work / "in.txt", "--sampling", "--beam", "4",
        "--temperature", "1e-300", "--topp", "1e-38",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [bool(x) for x in result.stdout.splitlines()] == [True, True]


def test_a_huge_temperature_samples_every_token_alike(best):
    result = cli(
        "translate", "-m", best, "--sampling", "--temperature", "1e300", input="A dog.\nTwo men.\n"
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2


HUGE_OPTIONS = [
    (["--beam", str(10**20)], f"--beam must be from 1 to 256, got {10**20}"),
    (["--beam", "257"], "--beam must be from 1 to 256, got 257"),
    (["--nbest", str(10**20)], f"--nbest must be from 1 to 256, got {10**20}"),
    (
        ["--batch-tokens", str(10**30)],
        f"--batch-tokens must be from 1 to 2,147,483,647, got {10**30}",
    ),
    (["--lenpen", "1e300"], "--lenpen must be from 0 to 10, got 1e+300"),
    (["--lenpen", "inf"], "--lenpen must be from 0 to 10, got inf"),
    (["--no-repeat-ngram", str(10**20)], "--no-repeat-ngram must be from 1 to 2,147,483,647"),
    (["--max-len-b", str(10**30)], ""),  # works: the model's positions (3cc65ae)
]


@pytest.mark.parametrize(("args", "says"), HUGE_OPTIONS)
def test_translate_huge_option_values_name_the_option_and_its_range(
    work, best, exported, args, says
):
    (work / "in.txt").write_text("A dog.\n")
    before = snapshot(work)
    for model in (best, exported):
        result = cli("translate", "-m", model, "-i", work / "in.txt", "-o", work / "out.txt", *args)
        if not says:
            assert result.exit_code == 0 and (work / "out.txt").read_text().strip()
            (work / "out.txt").unlink()
            continue
        assert says in assert_one_line(result), result.stderr
    assert snapshot(work) == before


@pytest.mark.parametrize("option", ["--beam", "--nbest", "--batch-tokens"])
def test_a_float_for_an_integer_option_is_one_line(option):
    proc = subprocess.run(
        [sys.executable, "-m", "mtkit", "translate", "-m", "x.pt", option, "1e20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and f"'{option}'" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    HUGE_OPTIONS[:2]
    + HUGE_OPTIONS[4:6]
    + [
        (["--sampling", "--temperature", "nan"], "--temperature must be above 0, got nan"),
        (["--sampling", "--topp", "0"], "--topp must be in (0, 1], got 0.0"),
    ],
)
def test_serve_huge_option_values_are_refused_at_start(best, args, says):
    assert says in serve_refused("-m", best, "--port", "1", *args)


def test_config_lenpen_and_batch_tokens_have_a_highest_value(work):
    for key, says in (
        ("decode.lenpen=1e300", "decode.lenpen"),
        ("decode.batch_tokens=" + str(10**30), "decode.batch_tokens"),
    ):
        assert says in assert_one_line(cli("tokenizer", "-c", work / "exp.yaml", "--set", key))


# 6. an empty API key is refused at start


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--api-key", ""], {}),
        (["--api-key", "  "], {}),
        ([], {"MTKIT_API_KEY": ""}),
        ([], {"MTKIT_API_KEY": " \t"}),
    ],
)
def test_serve_refuses_an_empty_api_key(best, args, env):
    line = serve_refused("-m", best, "--port", "1", *args, env={**os.environ, **env})
    assert line == (
        "error: the API key is empty (--api-key or MTKIT_API_KEY): give a key, or "
        "neither to serve without one"
    )


# 7. one line, one checkpoint, one layer: no "1 lines"


def test_messages_say_one_line_not_one_lines(work, best):
    (work / "one.txt").write_text("A dog.\n")
    (work / "two.txt").write_text("A dog.\nTwo men.\n")
    before = snapshot(work)
    assert_one_line(
        cli("eval", "--hyp", work / "one.txt", "--ref", work / "two.txt"),
        says=f"{work / 'one.txt'} has 1 line, {work / 'two.txt'} has 2",
    )
    assert_one_line(
        cli("eval", "-m", best, "--src", work / "one.txt", "--ref", work / "two.txt"),
        says="has 1 line,",
    )
    assert_one_line(
        cli("translate", "-m", best, "-i", work / "two.txt", "--prefix-file", work / "one.txt"),
        says=f"{work / 'one.txt'} has 1 line, the input has 2",
    )
    assert_one_line(
        cli("translate", "-m", best, "--alignments", "--align-layer", "3", input="A dog.\n"),
        says="--align-layer must be 0 (the model has 1 decoder layer), got 3",
    )
    assert snapshot(work) == before


def test_averaging_one_checkpoint_says_one_checkpoint(work, best):
    result = cli("average", best, "-o", work / "avg.pt")
    assert result.exit_code == 0, result.output
    assert f"averaged 1 checkpoint into {work / 'avg.pt'}" in result.stderr


def test_score_counts_one_hypothesis():
    from mtkit.core.scoring import EvalError, score

    with pytest.raises(EvalError, match="^1 hypothesis but 2 references$"):
        score(["a"], ["a", "b"], ["bleu"])


@pytest.mark.parametrize(
    "args",
    [["--beam", "0"], ["-i", "no-such-input.txt"], ["--format", "jsonl", "--tgt-lang", "xx"]],
)
def test_a_refused_translation_prints_its_error_line_alone_when_precision_is_measured(
    trained, tmp_path, args
):
    """`--precision auto` measures on the CPU before the options that need the model are
    checked; that measurement is logged only with -v, so the error is stderr's one line
    (a real process: the test runner does not see the log handler's stderr)."""
    checkpoint = trained / "run" / "checkpoints" / "best.pt"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtkit",
            "translate",
            "-m",
            str(checkpoint),
            "--precision",
            "auto",
            *args,
        ],
        input="ein Satz\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines

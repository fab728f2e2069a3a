"""Terminology constraints through the CLI and the server: `translate --constraints`,
`--glossary`, jsonl `constraints`, `eval -m --terms`, serve's `constraints` field and
`--glossary`, and each way they are refused (one line, exit 2, nothing written). Uses the
tiny trained run of tests/conftest.py: its outputs are poor, but every constraint must
still appear in them."""

from __future__ import annotations

import json

import pytest

from mtkit.core.terms import Glossary, occurs

from conftest import cli, one_line_error

LINES = ["A dog runs in the park.", "", "Two men talk on a bench.", "A girl in red."]
PHRASES = ["Hund\tPark", "", "Männer", ""]  # one line per input line


@pytest.fixture
def best(trained):
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "src.en").write_text("\n".join(LINES) + "\n")
    (tmp_path / "c.tsv").write_text("\n".join(PHRASES) + "\n")
    (tmp_path / "g.tsv").write_text("dog\tHund\ngirl\tMädchen\ngirl\tFrau\n")
    return tmp_path


def test_every_constraint_appears_as_whole_words_and_the_rest_are_unchanged(best, files):
    plain = cli("translate", "-m", best, "-i", files / "src.en").stdout.splitlines()
    result = cli("translate", "-m", best, "-i", files / "src.en", "--constraints", files / "c.tsv")
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert len(out) == 4 and out[1] == "" and out[3] == plain[3]  # no constraints: as before
    for text, phrases in zip(out, PHRASES, strict=True):
        assert all(occurs(p, text) for p in phrases.split("\t") if p), (text, phrases)
    glossary = cli(
        "translate", "-m", best, "-i", files / "src.en", "--glossary", files / "g.tsv"
    ).stdout.splitlines()
    assert occurs("Hund", glossary[0])
    assert occurs("Mädchen", glossary[3]) or occurs("Frau", glossary[3])
    assert glossary[2] == plain[2]  # no glossary term in its source


def test_jsonl_constraints_and_whether_they_were_met(best):
    records = [
        json.dumps({"src": LINES[0], "constraints": ["Hund", ["Park", "Wiese"]]}),
        json.dumps({"src": LINES[2], "constraints": "Männer"}),
        json.dumps({"src": LINES[3]}),
    ]
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        "--nbest",
        "2",
        input="\n".join(records) + "\n",
    )
    assert result.exit_code == 0, result.output
    first, bad, last = (json.loads(x) for x in result.stdout.splitlines())
    assert occurs("Hund", first["translation"]) and first["constraints_met"] is True
    assert occurs("Park", first["translation"]) or occurs("Wiese", first["translation"])
    assert len(first["nbest"]) == 2 and first["nbest"][0]["constraints_met"]
    # n-best is filled up with unconstrained hypotheses where fewer met the constraints
    assert all(occurs("Hund", e["translation"]) for e in first["nbest"] if e["constraints_met"])
    assert bad["error"].startswith("constraints: expected a list") and bad["line"] == 1
    assert "constraints_met" not in last


def test_eval_with_a_model_constrains_the_translation_by_the_terms(best, files, trained):
    ref = files / "ref.de"
    ref.write_text("Ein Hund rennt im Park.\n\nZwei Männer reden.\nEin Mädchen.\n")
    result = cli(
        "eval",
        "-m",
        best,
        "--src",
        files / "src.en",
        "--ref",
        ref,
        "--terms",
        files / "c.tsv",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["terms"] == {
        "score": 100.0,
        "found": 3,
        "total": 3,
        "text": "term accuracy 100.0% (3/3)",
    }


@pytest.mark.parametrize(
    "args, says",
    [
        (["--beam", "1"], "--constraints needs a beam of 2 or more (--beam 1)"),
        (["--sampling"], "--constraints needs beam search, not --sampling"),
        (
            ["--max-len-a", "0", "--max-len-b", "2", "--beam", "3"],
            "line 1: the constraint 'Hund Katze Maus Vogel' is",
        ),
    ],
)
def test_constraints_the_search_cannot_meet_are_refused_before_any_output(best, files, args, says):
    (files / "c.tsv").write_text("Hund Katze Maus Vogel\n\n\n\n")
    out = files / "out.de"
    one_line_error(
        cli(
            "translate",
            "-m",
            best,
            "-i",
            files / "src.en",
            "-o",
            out,
            "--constraints",
            files / "c.tsv",
            *args,
        ),
        says,
    )
    assert not out.exists()


def test_a_constraints_file_must_match_the_input_and_be_text_input(best, files):
    (files / "c.tsv").write_text("Hund\n")
    one_line_error(
        cli("translate", "-m", best, "-i", files / "src.en", "--constraints", files / "c.tsv"),
        "--constraints",
    )
    one_line_error(
        cli(
            "translate",
            "-m",
            best,
            "--format",
            "jsonl",
            "--constraints",
            files / "c.tsv",
            input="{}\n",
        ),
        'in jsonl give each line "constraints"',
    )
    one_line_error(
        cli(
            "translate",
            "-m",
            best,
            "-i",
            files / "src.en",
            "-o",
            files / "c.tsv",
            "--constraints",
            files / "c.tsv",
        ),
        "--constraints",
    )
    assert (files / "c.tsv").read_text() == "Hund\n"


def test_an_export_refuses_constraints_in_one_line(exported, files):
    for option, path in (("--constraints", files / "c.tsv"), ("--glossary", files / "g.tsv")):
        one_line_error(
            cli("translate", "-m", exported, "-i", files / "src.en", option, path),
            f"{option} needs a checkpoint",
        )


def test_serve_takes_constraints_per_sentence_and_a_glossary(best, files):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    engine = load_engine(best, "cpu")
    opts = SearchOptions.from_config(engine.config.decode)
    api = create_app(engine, opts, Limits(), "best.pt", glossary=Glossary.read(files / "g.tsv"))
    with TestClient(api) as client:
        info = client.get("/v1/info").json()
        assert info["constraints"] is True and info["glossary_terms"] == 2
        answer = client.post(
            "/v1/translate", json={"text": LINES, "constraints": [["Park"], [], ["Männer"], []]}
        ).json()
        texts = [t["text"] for t in answer["translations"]]
        assert occurs("Park", texts[0]) and occurs("Hund", texts[0])  # its own, the glossary's
        assert occurs("Männer", texts[2]) and answer["translations"][2]["constraints_met"]
        assert occurs("Mädchen", texts[3]) or occurs("Frau", texts[3])
        for body, says in (
            ({"text": ["A dog."], "constraints": [[], []]}, "one list per sentence"),
            ({"text": ["A dog."], "constraints": [[""]]}, "constraints.0: item 0"),
            (
                {"text": ["A dog."], "beam": 1},
                "this server's glossary (serve --glossary) needs a beam",
            ),
            (
                {"text": ["A dog."], "constraints": [["Hund " * 80]]},
                "constraints.0: the constraint",
            ),
        ):
            r = client.post("/v1/translate", json=body)
            assert r.status_code == 422 and says in r.json()["error"], r.text


def test_constraints_with_alignments_and_too_many_constraints(best, files):
    rows = cli(
        "translate",
        "-m",
        best,
        "-i",
        files / "src.en",
        "--constraints",
        files / "c.tsv",
        "--alignments",
    ).stdout.splitlines()
    text, links = rows[0].split("\t")
    assert occurs("Hund", text) and occurs("Park", text) and links
    many = json.dumps({"src": LINES[0], "constraints": [f"w{i}" for i in range(63)]})
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        "--max-len-b",
        "500",
        input=many + "\n" + json.dumps({"src": LINES[2]}) + "\n",
    )
    assert result.exit_code == 0, result.output
    refused, fine = (json.loads(x) for x in result.stdout.splitlines())
    assert refused["error"] == "constraints: 63 constraints; a line may have at most 62"
    assert "translation" in fine


def test_a_bad_later_line_stops_before_anything_reaches_stdout(best, files):
    (files / "c.tsv").write_text("Hund\n\n\n東京\n")  # the last: characters the model lacks
    one_line_error(
        cli("translate", "-m", best, "-i", files / "src.en", "--constraints", files / "c.tsv"),
        "line 4: the constraint '東京' cannot be searched for",
    )


def test_a_glossary_term_that_cannot_fit_is_left_out_with_a_warning(best, files):
    (files / "g.tsv").write_text("dog\t" + "Hund " * 60 + "\ngirl\tMädchen\n")
    result = cli("translate", "-m", best, "-i", files / "src.en", "--glossary", files / "g.tsv")
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert len(out) == 4 and occurs("Mädchen", out[3])
    assert "line 1: the glossary's terms are left out" in result.stderr

"""`mtkit eval --terms / --glossary` through Typer's CliRunner: term accuracy beside the
metrics, on given hypotheses (no model)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mtkit.cli import app

runner = CliRunner()


@pytest.fixture()
def files(tmp_path):
    texts = {
        "src.en": "The house is red.\nA dog in New York.\nNothing here.\n",
        "hyp.de": "Das Haus ist rot.\nEin Hund in NY.\nHier nichts.\n",
        "ref.de": "Das Haus ist rot.\nEin Hund in New York.\nHier ist nichts.\n",
        "terms.de": "Haus\trot\n\nnichts\n",
        "glossary.tsv": "# en\tde\nhouse\tHaus\nNew York\tNew York\nNew York\tNY\n"
        "dog\tHund\nred\trot\nYork\tYork\n",
    }
    out = {}
    for name, text in texts.items():
        out[name] = tmp_path / name
        out[name].write_text(text, encoding="utf-8")
    return out


def eval_(files, *options: str):
    return runner.invoke(
        app,
        [
            "eval",
            "--hyp",
            str(files["hyp.de"]),
            "--ref",
            str(files["ref.de"]),
            "--metrics",
            "bleu",
            *options,
        ],
    )


def test_terms_file_prints_term_accuracy_after_the_metrics(files):
    result = eval_(files, "--terms", str(files["terms.de"]))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("BLEU = ")
    assert lines[1] == "term accuracy 100.0% (3/3)"


def test_glossary_with_src_in_json(files):
    # house and red, then dog and New York (found as its alternative NY); the "York"
    # inside "New York" is not required (the hypothesis has no York).
    result = eval_(
        files, "--glossary", str(files["glossary.tsv"]), "--src", str(files["src.en"]), "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == {"bleu", "terms"}
    assert report["terms"] == {
        "score": 100.0,
        "found": 4,
        "total": 4,
        "text": "term accuracy 100.0% (4/4)",
    }


def test_terms_and_glossary_together_count_a_shared_term_once(files):
    files["hyp.de"].write_text("Das Haus ist blau.\nEin Hund.\nHier nichts.\n")
    result = eval_(
        files,
        "--terms",
        str(files["terms.de"]),
        "--glossary",
        str(files["glossary.tsv"]),
        "--src",
        str(files["src.en"]),
        "--json",
    )
    assert result.exit_code == 0, result.output
    # Haus, rot (file and glossary: once), Hund, New York|NY, nichts: 3 of 5 found.
    assert json.loads(result.stdout)["terms"] == {
        "score": 60.0,
        "found": 3,
        "total": 5,
        "text": "term accuracy 60.0% (3/5)",
    }


def test_no_terms_required_is_null_in_json(files):
    files["terms.de"].write_text("\n\n\n")
    result = eval_(files, "--terms", str(files["terms.de"]), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["terms"] == {
        "score": None,
        "found": 0,
        "total": 0,
        "text": "term accuracy n/a (no terms required)",
    }


def test_terms_line_count_mismatch_is_one_line(files):
    files["terms.de"].write_text("Haus\nrot\n")
    result = eval_(files, "--terms", str(files["terms.de"]))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: line counts differ: {files['terms.de']} has 2 lines, {files['ref.de']} has 3"
    )


def test_glossary_without_src_is_one_line(files):
    result = eval_(files, "--glossary", str(files["glossary.tsv"]))
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --glossary needs --src S: the source lines it finds terms in"
    )


def test_src_with_hyp_but_no_glossary_is_one_line(files):
    result = eval_(files, "--src", str(files["src.en"]))
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --src with --hyp is only for --glossary; to translate it, give -m"
    )


def test_bad_glossary_line_is_one_line(files):
    files["glossary.tsv"].write_text("house\tHaus\nred\n")
    result = eval_(files, "--glossary", str(files["glossary.tsv"]), "--src", str(files["src.en"]))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {files['glossary.tsv']}: line 2: expected "
        f"'source term<TAB>target term', got 1 field: 'red'"
    )

"""One model for two directions (`mtkit.core.languages`): the copy task as two "languages",
copy (`cp`) and copy reversed (`rv`), chosen by the <2xx> tag each source line starts
with. Both are learned by one model and `translate --tgt-lang` picks which (serve's
target_lang, and an export to CTranslate2, likewise); a missing or unknown language is
one line. Validation and `mtkit run` score each direction on its own. The model with the
tag on the target side: test_multilingual_target.py; what both use: tests/twoway.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import cli, one_line_error
from twoway import check_target_language_pieces, copied_or_reversed, train_two_way


@pytest.fixture(scope="module")
def two_way(tmp_path_factory):
    return train_two_way(tmp_path_factory.mktemp("multilingual"))


def test_validation_scores_each_direction_and_best_follows_their_mean(two_way):
    checkpoint, _ = two_way
    lines = (checkpoint.parents[1] / "metrics.jsonl").read_text().splitlines()
    valid = [r for r in map(json.loads, lines) if r.get("event") == "valid"][-1]
    each = valid["by_direction"]
    assert set(each) == {"src-cp", "src-rv"}
    assert each["src-cp"]["valid_bleu"] > each["src-rv"]["valid_bleu"] > 50  # copying: easier
    mean = (each["src-cp"]["valid_bleu"] + each["src-rv"]["valid_bleu"]) / 2
    assert valid["valid_bleu"] == pytest.approx(mean, abs=1e-3)
    assert valid["best_bleu"] == pytest.approx(mean, abs=1e-3)  # the only validation


def test_run_prints_a_table_of_the_test_directions(two_way):
    checkpoint, _ = two_way
    run = checkpoint.parents[1]
    manifest = json.loads((run / "data" / "train" / "manifest.json").read_text())
    assert manifest["directions"] == {
        "src-cp": {"pairs": manifest["pairs"] // 2, "share": 0.5},
        "src-rv": {"pairs": manifest["pairs"] // 2, "share": 0.5},
    }
    result = cli("run", "--config", run / "config.yaml")  # trained: translates and scores
    assert result.exit_code == 0, result.output
    header, cp, rv, mean = result.stdout.splitlines()[:4]
    assert header.split() == ["direction", "BLEU", "chrF", "TER"]
    assert cp.startswith("src-cp ") and rv.startswith("src-rv ") and mean.startswith("mean")
    scores = json.loads((run / "test.scores.json").read_text())["directions"]
    assert float(cp.split()[1]) == pytest.approx(scores["src-cp"]["bleu"]["score"], abs=0.01)
    assert scores["src-cp"]["bleu"]["score"] > 90
    assert scores["src-cp"]["bleu"]["score"] > scores["src-rv"]["bleu"]["score"]


def test_serve_takes_target_lang_and_info_lists_the_directions(two_way):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    checkpoint, sources = two_way
    engine = load_engine(checkpoint, "cpu", precision="fp32")
    app = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(), "last.pt")
    with TestClient(app) as api:
        info = api.get("/v1/info").json()
        assert info["directions"] == ["src-cp", "src-rv"]
        assert info["target_languages"] == ["cp", "rv"]
        line = sources[0]
        answer = api.post(
            "/v1/translate", json={"text": [line, ""], "target_lang": "rv", "alignments": True}
        ).json()
        first, empty = answer["translations"]
        links = [tuple(map(int, x.split("-"))) for x in first["alignment"].split()]
        opts = replace(SearchOptions.from_config(engine.config.decode), alignments=True)
        best = engine.translate(["<2rv> " + line], opts)[0][0]  # the line as the model reads it
        assert first["text"] == engine.tgt_vocab.decode(best.tokens) and empty["text"] == ""
        tagged = best.alignment
        assert links == [(s - 1, t) for s, t in tagged if s > 0]  # the tag: not a user word
        assert links and all(0 <= s < len(line.split()) for s, _ in links)
        for body, says in (
            ({"text": [line]}, "give target_lang with one of them"),
            (
                {"text": [line], "target_lang": "fr"},
                "target_lang fr: this model translates into cp, rv",
            ),
        ):
            r = api.post("/v1/translate", json=body)
            assert r.status_code == 422 and says in r.json()["error"], r.json()
        assert 'id="target_lang"' in api.get("/").text


def test_an_export_keeps_the_tags(two_way, tmp_path):
    pytest.importorskip("ctranslate2")
    checkpoint, sources = two_way
    out = tmp_path / "ct2"
    result = cli("export", "-m", checkpoint, "--to", "ctranslate2", "-o", out)
    assert result.exit_code == 0, result.output
    text = "\n".join(sources[:20]) + "\n"
    native = cli(
        "translate", "-m", checkpoint, "--tgt-lang", "rv", "--precision", "fp32", input=text
    )
    exported = cli("translate", "-m", out, "--tgt-lang", "rv", input=text)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == native.stdout
    one_line_error(
        cli("translate", "-m", out, input=text),
        "this model translates into cp, rv: give --tgt-lang",
    )


def test_one_model_copies_or_reverses_as_the_tag_asks(two_way):
    checkpoint, sources = two_way
    # Reversing is the harder task (exact on 53-60 of the 60 lines across CPU kernels
    # when this fixture trained 3,000 steps); either way, not the other task's output.
    copied_or_reversed(checkpoint, sources, 0.75)


def test_a_multilingual_model_needs_a_language_it_knows(two_way):
    checkpoint, _ = two_way
    one_line_error(
        cli("translate", "-m", checkpoint, input="a b c\n"),
        "this model translates into cp, rv: give --tgt-lang",
    )
    one_line_error(
        cli("translate", "-m", checkpoint, "--tgt-lang", "de", input="a b c\n"),
        "--tgt-lang de: this model translates into cp, rv",
    )
    records = cli(
        "translate",
        "-m",
        checkpoint,
        "--format",
        "jsonl",
        "--precision",
        "fp32",
        input='{"src": "a b c", "tgt_lang": "rv"}\n{"src": "a b c"}\n',
    )
    assert records.exit_code == 0, records.output
    first, second = records.stdout.splitlines()
    assert '"translation": "c b a"' in first and "give --tgt-lang" in second


def test_outputs_keep_to_the_target_languages_pieces(two_way, tmp_path):
    check_target_language_pieces(*two_way, tmp_path)

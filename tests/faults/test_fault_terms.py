"""Terminology and languages meet bad input as the first commands do: a jsonl
record that cannot be searched with its constraints is one error record and the stream
goes on; options that fail every record are one line before any output; `eval -m` keeps
the model's language code apart from the language-ID code and checks both before it
translates; `serve --glossary` names the glossary when a request's options cannot search
with it; a blank line's constraints are reported unmet; a language tag is no constraint;
nothing the user gave is echoed whole."""

from __future__ import annotations

import json

import pytest
import yaml

from mtkit.core.config import config_from_dict
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer
from mtkit.training.loop import train

from conftest import one_line_error, tiny_config_dict
from faultkit import assert_one_line, cli

LINES = ["A dog runs in the park.", "", "Two men talk on a bench.", "A girl in red."]
NEEDS_BEAM = (
    "constraints: searching for them needs a beam of 2 or more (--beam 1): the "
    "beam is shared among hypotheses that have met different numbers of "
    "constraint tokens"
)


@pytest.fixture
def best(trained):
    return trained / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def multilingual(corpus, tmp_path_factory):
    """A tiny model into two languages whose codes py3langid does not know: `deu` (the
    German side) and `cp` (the English side, copied), tags before the source."""
    folder = tmp_path_factory.mktemp("multilingual")
    data = tiny_config_dict(corpus, folder / "run")
    for split in ("train", "valid", "test"):
        data["data"][split] = [
            {
                "src": str(corpus[f"{split}.en"]),
                "tgt": str(corpus[f"{split}.de"]),
                "tgt_lang": "deu",
            },
            {
                "src": str(corpus[f"{split}.en"]),
                "tgt": str(corpus[f"{split}.en"]),
                "tgt_lang": "cp",
            },
        ]
    (folder / "exp.yaml").write_text(yaml.safe_dump(data))
    cfg = config_from_dict(data)
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    return folder / "run" / "checkpoints" / "best.pt"


def records(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines()]


def jsonl(*items: dict) -> str:
    return "".join(json.dumps(x) + "\n" for x in items)


# --- 2: one record that cannot be searched with its constraints is one error record ---


NEEDS_SEARCH = "constraints: searching for them needs beam search, not --sampling"


@pytest.mark.parametrize("to_file", [True, False], ids=["-o", "stdout"])
@pytest.mark.parametrize(
    "args, says",
    [
        (["--beam", "1"], NEEDS_BEAM),
        (["--sampling"], NEEDS_SEARCH),
        (["--sampling", "--beam", "4"], NEEDS_SEARCH),
    ],
)
def test_a_record_the_options_cannot_constrain_is_an_error_record_and_the_stream_goes_on(
    best, tmp_path, args, says, to_file
):
    out = tmp_path / "out.jsonl"
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        *(["-o", out] if to_file else []),
        *args,
        input=jsonl(
            {"src": LINES[0]},
            {"src": LINES[2], "constraints": ["Männer"]},
            {"src": LINES[3], "id": 3},
        ),
    )
    assert result.exit_code == 0, result.output
    written = out.read_text() if to_file else result.stdout  # the file is written, whole
    first, refused, last = records(written)
    assert "translation" in first and "translation" in last and last["id"] == 3
    assert refused == {"line": 1, "error": says}
    assert "--constraints" not in result.output  # never given


@pytest.mark.parametrize("to_file", [True, False], ids=["-o", "stdout"])
def test_a_record_with_constraints_on_an_export_is_an_error_record(exported, tmp_path, to_file):
    out = tmp_path / "out.jsonl"
    result = cli(
        "translate",
        "-m",
        exported,
        "--format",
        "jsonl",
        *(["-o", out] if to_file else []),
        input=jsonl({"src": LINES[0], "constraints": ["Hund"]}, {"src": LINES[2]}),
    )
    assert result.exit_code == 0, result.output
    refused, fine = records(out.read_text() if to_file else result.stdout)
    assert refused == {
        "line": 0,
        "error": "constraints: searching for them needs a "
        "checkpoint (-m FILE.pt), not an exported CTranslate2 folder",
    }
    assert "translation" in fine and "--constraints" not in result.output


def test_one_record_with_constraints_among_300_under_beam_1_is_the_only_error(best, tmp_path):
    out = tmp_path / "out.jsonl"
    lines = [{"src": LINES[0]}] * 150 + [{"src": "a", "constraints": ["b"]}]
    result = cli(
        "translate", "-m", best, "--format", "jsonl", "--beam", "1", "-o", out,
        input=jsonl(*lines, *[{"src": LINES[2]}] * 149),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = records(out.read_text())
    assert len(written) == 300 and written[150] == {"line": 150, "error": NEEDS_BEAM}
    assert all("translation" in r for k, r in enumerate(written) if k != 150)


def test_a_glossary_the_options_cannot_search_with_is_still_one_line_before_any_output(
    best, tmp_path
):
    (tmp_path / "g.tsv").write_text("dog\tHund\n")
    out = tmp_path / "out.jsonl"
    one_line_error(
        cli(
            "translate",
            "-m",
            best,
            "--format",
            "jsonl",
            "--beam",
            "1",
            "-o",
            out,
            "--glossary",
            tmp_path / "g.tsv",
            input=jsonl({"src": LINES[0]}),
        ),
        "--glossary needs a beam of 2 or more (--beam 1)",
    )
    assert not out.exists()


# --- 4: an unknown --tgt-lang fails every record: one line before any output ---


def test_jsonl_with_a_tgt_lang_the_model_lacks_is_one_line_before_any_output(
    best, multilingual, tmp_path
):
    out = tmp_path / "out.jsonl"
    for model, says in (
        (best, "error: --tgt-lang xx: this model translates en into de only"),
        (multilingual, "error: --tgt-lang xx: this model translates into cp, deu"),
    ):
        result = cli(
            "translate",
            "-m",
            model,
            "--format",
            "jsonl",
            "--tgt-lang",
            "xx",
            "-o",
            out,
            input=jsonl({"src": LINES[0]}, {"src": LINES[2]}),
        )
        assert assert_one_line(result) == says
        assert result.stdout == "" and not out.exists()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--format", "jsonl", "--tgt-lang", "c p"], "is not a language code"),
        (["--format", "jsonl", "--tgt-lang", ""], "is not a language code"),
        (["--tgt-lang", "xx"], "error: --tgt-lang xx: this model translates into cp, deu"),
    ],
)
def test_a_tgt_lang_that_is_no_code_or_not_the_models_is_one_line_before_any_output(
    multilingual, tmp_path, args, says
):
    result = cli("translate", "-m", multilingual, *args, input=jsonl({"src": LINES[0]}))
    assert_one_line(result, says=says)
    assert result.stdout == ""
    assert not list(tmp_path.iterdir())


def test_jsonl_records_name_their_own_language_where_tgt_lang_is_not_given(multilingual):
    result = cli(
        "translate",
        "-m",
        multilingual,
        "--format",
        "jsonl",
        input=jsonl(
            {"src": LINES[0]},
            {"src": LINES[0], "tgt_lang": "cp"},
            {"src": LINES[0], "tgt_lang": "xx"},
        ),
    )
    assert result.exit_code == 0, result.output
    missing, fine, unknown = records(result.stdout)
    assert missing["error"] == (
        'this model translates into cp, deu: give --tgt-lang or "tgt_lang" with one of them'
    )
    assert "translation" in fine
    assert unknown["error"] == "tgt_lang xx: this model translates into cp, deu"


# --- 9: eval -m keeps the model's language apart from the language-ID code ---


@pytest.fixture
def sources(tmp_path, corpus):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(corpus["test.en"].read_text().splitlines(True)[:6]))
    ref.write_text("".join(corpus["test.de"].read_text().splitlines(True)[:6]))
    return src, ref


@pytest.fixture
def no_translating(monkeypatch):
    """Any translation fails the test: what is refused must be refused before it."""
    from mtkit.engines.pytorch import TorchEngine

    def translate(*args, **kwargs):
        raise AssertionError("translated before refusing")

    monkeypatch.setattr(TorchEngine, "translate", translate)


def test_eval_of_a_model_whose_codes_are_not_iso_639_1_takes_tgt_lang_and_lang(
    multilingual, sources
):
    pytest.importorskip("py3langid")
    src, ref = sources
    result = cli(
        "eval",
        "-m",
        multilingual,
        "--src",
        src,
        "--ref",
        ref,
        "--tgt-lang",
        "deu",
        "--lang",
        "de",
        "--among",
        "en,de",
        "--json",
        "--metrics",
        "bleu",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "bleu" in report and report["off_target"]["lang"] == "de"
    assert report["off_target"]["among"] == ["de", "en"] and report["off_target"]["lines"] == 6


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--lang", "de"],
            "error: --lang de: this model translates into cp, deu; give --tgt-lang "
            "for the model's code (--lang is the language-ID code the "
            "translations are checked against)",
        ),
        (
            ["--tgt-lang", "deu", "--lang", "de"],
            "error: the model's languages cp, deu, en: py3langid does not know cp, deu; it knows",
        ),
        (["--lang", "deu"], "error: --lang deu: py3langid does not know it; it knows"),
        (
            ["--tgt-lang", "xx", "--lang", "de", "--among", "en,de"],
            "error: --tgt-lang xx: this model translates into cp, deu",
        ),
        (
            ["--tgt-lang", "deu", "--lang", "fr", "--among", "en,de"],
            "error: --lang fr is not among en, de",
        ),
    ],
)
def test_eval_refuses_what_would_fail_before_translating(
    multilingual, sources, no_translating, args, says
):
    pytest.importorskip("py3langid")
    src, ref = sources
    result = cli("eval", "-m", multilingual, "--src", src, "--ref", ref, *args)
    assert assert_one_line(result).startswith(says)
    assert result.stdout == ""


# --- 10: serve --glossary and greedy requests; /v1/info's languages ---


def test_serve_glossary_refuses_a_greedy_request_naming_the_glossary(best, multilingual, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mtkit.core.search_options import SearchOptions
    from mtkit.core.terms import Glossary
    from mtkit.engines.loader import load_engine
    from mtkit.serving.app import create_app
    from mtkit.serving.scheduler import Limits

    (tmp_path / "g.tsv").write_text("dog\tHund\n")
    engine = load_engine(best, "cpu")
    api = create_app(
        engine,
        SearchOptions.from_config(engine.config.decode),
        Limits(),
        "best.pt",
        glossary=Glossary.read(tmp_path / "g.tsv"),
    )
    with TestClient(api) as client:
        assert client.get("/v1/info").json()["target_language"] == "de"
        for text in ([LINES[0]], [LINES[2]]):  # with a term and without: the same answer
            r = client.post("/v1/translate", json={"text": text, "beam": 1})
            assert r.status_code == 422 and r.json() == {
                "error": "this server's glossary (serve --glossary) needs a beam of 2 or more "
                "(beam 1): the beam is shared among hypotheses that have met "
                "different numbers of constraint tokens",
                "field": "beam",
            }
        r = client.post(
            "/v1/translate", json={"text": [LINES[0], ""], "constraints": [[], ["Hund"]]}
        )
        assert r.status_code == 200, r.text
        term, blank = r.json()["translations"]
        assert "Hund" in term["text"] and term["constraints_met"] is True
        assert blank == {"text": "", "score": 0.0, "confidence": 0.0, "constraints_met": False}
        r = client.post(
            "/v1/translate", json={"text": [LINES[0]], "constraints": [["Hund " * 100_000]]}
        )
        assert r.status_code == 422 and len(r.text) < 500, r.text[:200]  # 12: not echoed
    engine = load_engine(multilingual, "cpu")
    api = create_app(engine, SearchOptions.from_config(engine.config.decode), Limits(), "m")
    with TestClient(api) as client:
        info = client.get("/v1/info").json()
        assert (info["source_language"], info["target_language"]) == ("en", "cp, deu")
        assert info["target_languages"] == ["cp", "deu"]
        r = client.post(
            "/v1/translate",
            json={"text": [LINES[0]], "target_lang": "deu", "constraints": [["<2cp>"]]},
        )
        assert r.status_code == 422 and r.json()["error"] == (
            "constraints.0: the constraint '<2cp>' cannot be searched for: it holds a "
            "language tag or another control piece, which is no text"
        )
        r = client.post(
            "/v1/translate",
            json={"text": [LINES[0]], "target_lang": "deu", "constraints": [["Hund <2deu>"]]},
        )
        assert r.status_code == 422 and r.json()["error"] == (
            "constraints.0: the constraint 'Hund <2deu>' cannot be searched for: it holds a "
            "language tag or another control piece, which is no text"
        )
        for lang in ("xx", "c p", ""):
            r = client.post("/v1/translate", json={"text": [LINES[0]], "target_lang": lang})
            assert r.status_code == 422, (lang, r.text)


# --- 11: a blank line's constraints are reported unmet ---


def test_a_blank_line_with_constraints_is_reported_unmet(best, tmp_path):
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        input=jsonl(
            {"src": "", "constraints": ["Hund"]},
            {"src": LINES[0]},
            {"src": "  ", "constraints": ["Hund"]},
        ),
    )
    assert result.exit_code == 0, result.output
    blank, fine, spaces = records(result.stdout)
    assert blank == {
        "line": 0,
        "source": "",
        "translation": "",
        "score": 0.0,
        "confidence": 0.0,
        "constraints_met": False,
    }
    assert spaces["constraints_met"] is False and "constraints_met" not in fine
    for n in (1, 3):
        assert (
            f'line {n} (record "line": {n - 1}): the source is empty, and so is its '
            f"translation: its constraints are not met"
        ) in result.stderr
    (tmp_path / "in.en").write_text("\n".join(LINES) + "\n")
    (tmp_path / "c.tsv").write_text("\nMänner\n\n\n")  # the phrase is on the blank line
    result = cli(
        "translate", "-m", best, "-i", tmp_path / "in.en", "--constraints", tmp_path / "c.tsv"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == ""
    assert "line 2: the source is empty, and so is its translation" in result.stderr


# --- 12: echoes cut short; eval's language options; eval --glossary as translate ---


def test_an_over_long_constraint_is_not_echoed_whole(best, tmp_path):
    phrase = "Hund " * 120_000  # 600 KB
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        input=jsonl({"src": LINES[0], "constraints": [phrase]}, {"src": LINES[2]}),
    )
    assert result.exit_code == 0, result.output
    refused, fine = records(result.stdout)
    assert refused["error"].startswith("constraints: the constraint 'Hund Hund")
    assert "..." in refused["error"] and len(refused["error"]) < 300 and "translation" in fine
    (tmp_path / "in.en").write_text(LINES[0] + "\n")
    (tmp_path / "c.tsv").write_text(phrase + "\n")
    result = cli(
        "translate", "-m", best, "-i", tmp_path / "in.en", "--constraints", tmp_path / "c.tsv"
    )
    assert len(assert_one_line(result, says="line 1: the constraint 'Hund Hund")) < 300


@pytest.mark.parametrize(
    "args, says",
    [
        (["--lang", ""], "error: --lang is empty: give a language code, such as de"),
        (["--lang", " "], "error: --lang is empty: give a language code, such as de"),
        (
            ["--lang", "de", "--among", ","],
            "error: --among ',' has no language codes: give them comma-separated, such as en,de",
        ),
        (
            ["--lang", "de", "--among", " , "],
            "error: --among ' , ' has no language codes: give them comma-separated, such as en,de",
        ),
        (
            ["--among", "en,de"],
            "error: --among is for --lang: give --lang too, the language "
            "the translations should be in",
        ),
        (
            ["--tgt-lang", "de"],
            "error: --tgt-lang is the language -m translates into: give -m, or leave it out",
        ),
    ],
)
def test_eval_language_options_that_would_be_ignored_are_refused(tmp_path, args, says):
    (tmp_path / "hyp").write_text("Ein Hund.\n")
    result = cli("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", *args)
    assert assert_one_line(result) == says
    assert result.stdout == ""


def test_eval_lang_that_is_no_code_is_one_line(tmp_path):
    pytest.importorskip("py3langid")
    (tmp_path / "hyp").write_text("Ein Hund.\n")
    result = cli("eval", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "hyp", "--lang", "c p")
    assert assert_one_line(result).startswith("error: --lang c p: py3langid does not know it")
    assert result.stdout == ""


def test_eval_with_a_glossary_warns_and_skips_a_term_it_cannot_spell_as_translate_does(
    best, tmp_path
):
    (tmp_path / "src.en").write_text("\n".join(LINES) + "\n")
    (tmp_path / "ref.de").write_text("Ein Hund.\n\nZwei Männer.\nEin Mädchen.\n")
    (tmp_path / "g.tsv").write_text("dog\t東京\nmen\tMänner\n")  # 東京: not in the vocabulary
    warning = (
        "line 1: the glossary's terms are left out: the constraint '東京' cannot be "
        "searched for: it has characters the target vocabulary lacks"
    )
    translated = cli(
        "translate", "-m", best, "-i", tmp_path / "src.en", "--glossary", tmp_path / "g.tsv"
    )
    assert translated.exit_code == 0 and warning in translated.stderr
    result = cli(
        "eval",
        "-m",
        best,
        "--src",
        tmp_path / "src.en",
        "--ref",
        tmp_path / "ref.de",
        "--glossary",
        tmp_path / "g.tsv",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert warning in result.stderr
    assert json.loads(result.stdout)["terms"]["total"] == 2  # still required: counted
    assert "Männer" in translated.stdout.splitlines()[2]
    (tmp_path / "t.tsv").write_text("東京\n\n\n\n")  # --terms: the user's own, as --constraints
    one_line_error(
        cli(
            "eval",
            "-m",
            best,
            "--src",
            tmp_path / "src.en",
            "--ref",
            tmp_path / "ref.de",
            "--terms",
            tmp_path / "t.tsv",
        ),
        "line 1: the constraint '東京' cannot be searched for",
    )


def test_jsonl_warnings_name_the_line_as_the_records_do(best, tmp_path):
    (tmp_path / "g.tsv").write_text("dog\t東京\n")
    result = cli(
        "translate",
        "-m",
        best,
        "--format",
        "jsonl",
        "--glossary",
        tmp_path / "g.tsv",
        input=jsonl({"src": LINES[2]}, {"src": LINES[0]}),
    )
    assert result.exit_code == 0, result.output
    assert [r["line"] for r in records(result.stdout)] == [0, 1]
    assert 'line 2 (record "line": 1): the glossary\'s terms are left out' in result.stderr


# --- a language tag, or any control piece, is no constraint ---


def test_a_constraint_that_is_a_language_tag_is_refused(multilingual, tmp_path):
    result = cli(
        "translate",
        "-m",
        multilingual,
        "--format",
        "jsonl",
        "--tgt-lang",
        "deu",
        input=jsonl(
            {"src": LINES[0], "constraints": ["<2cp>"]},
            {"src": LINES[0], "constraints": [["Hund <2deu>"]]},
            {"src": LINES[0], "constraints": ["Hund"]},
        ),
    )
    assert result.exit_code == 0, result.output
    tag, inside, fine = records(result.stdout)
    for record, phrase in ((tag, "<2cp>"), (inside, "Hund <2deu>")):
        assert record["error"] == (
            f"constraints: the constraint {phrase!r} cannot be "
            f"searched for: it holds a language tag or another "
            f"control piece, which is no text"
        )
    assert fine["constraints_met"] in (True, False)
    (tmp_path / "in.en").write_text(LINES[0] + "\n")
    (tmp_path / "c.tsv").write_text("<2deu>\n")
    one_line_error(
        cli(
            "translate",
            "-m",
            multilingual,
            "--tgt-lang",
            "deu",
            "-i",
            tmp_path / "in.en",
            "--constraints",
            tmp_path / "c.tsv",
        ),
        "line 1: the constraint '<2deu>' cannot be searched for: it holds a language tag",
    )


def test_an_engine_never_takes_a_special_piece_for_a_phrase(tiny_engine):
    from mtkit.core.search_options import SearchOptions

    errors = tiny_engine.constraint_errors(
        ["a b c"] * 3, [[("</s>",)], [("<pad>",)], []], SearchOptions(max_len_b=200)
    )
    assert errors[0].startswith("the constraint '</s>' cannot be searched for")
    assert errors[1].startswith("the constraint '<pad>' cannot be searched for")
    assert errors[2] == ""
    assert tiny_engine._control_ids >= {0, 1, 2, 3}

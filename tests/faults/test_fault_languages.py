"""Language codes and `mtkit run`'s own checks.

A language code becomes a `<2xx>` tag, a SentencePiece user-defined symbol: it must stay
one piece. `c p` used to be accepted and split into 7 pieces, which then appeared in
every translation; every code is now checked when the config loads, and wherever one
comes in as an option (`languages.check_language_code`). `mtkit run` without `data.test`
used to train fully and only then stop.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from mtkit.core.config import config_from_dict
from mtkit.core.configcheck import ConfigError
from mtkit.core.errors import OptionError
from mtkit.core.languages import check_language_code, check_target, tag, tags
from mtkit.core.vocab import load_vocabs
from mtkit.training.loop import TrainResult

from conftest import tiny_config_dict, write_config
from faultkit import assert_one_line, cli, snapshot


def _two_corpora(corpus, first: dict, second: dict) -> list[dict]:
    pair = {"src": str(corpus["train.en"]), "tgt": str(corpus["train.de"])}
    return [{**pair, **first}, {**pair, **second}]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"tgt_lang": "c p"}, "data.tgt_lang: 'c p' is not a language code"),
        ({"src_lang": ""}, "data.src_lang: '' is not a language code"),
        ({"tgt_lang": "x" * 36}, "data.tgt_lang: 'xxxxxxxxxx"),
        ({"tgt_lang": "fr>"}, "data.tgt_lang: 'fr>' is not a language code"),
        ({"tgt_lang": "français"}, "data.tgt_lang: 'français' is not a language code"),
        ({"tgt_lang": "de\n"}, "data.tgt_lang: 'de\\n' is not a language code"),
        (
            {"valid": {"src": "v.en", "tgt": "v.de", "tgt_lang": "c p"}},
            "data.valid.tgt_lang: 'c p' is not a language code",
        ),
    ],
)
def test_a_language_code_that_is_not_one_piece_is_refused_at_load(tmp_path, corpus, data, says):
    config = write_config(tmp_path, corpus, data=data)
    before = snapshot(tmp_path)
    line = assert_one_line(cli("tokenizer", "-c", config), says=f"{config}: {says}")
    assert "ASCII letters, digits, - and _" in line and len(line) < 250
    assert snapshot(tmp_path) == before  # nothing written: no run directory, no spm.model


def test_a_corpus_in_a_list_is_named_by_its_index(tmp_path, corpus):
    train = _two_corpora(corpus, {"tgt_lang": "de"}, {"tgt_lang": "c p"})
    config = write_config(tmp_path, corpus, data={"train": train})
    assert_one_line(
        cli("preprocess", "-c", config),
        says=f"{config}: data.train.1.tgt_lang: 'c p' is not a language code",
    )


def test_a_set_override_is_checked_the_same_way(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    assert_one_line(
        cli("run", "-c", config, "--set", "data.train.src_lang=c p"),
        says=f"{config}: data.train.src_lang: 'c p' is not a language code",
    )
    assert not (tmp_path / "run").exists()


def test_yaml_no_as_a_language_code_is_told_to_be_quoted(tmp_path, corpus):
    config = tmp_path / "exp.yaml"
    text = yaml.safe_dump(tiny_config_dict(corpus, tmp_path / "run"))
    config.write_text(text.replace("workers: 1", "workers: 1\n  tgt_lang: no"))
    assert_one_line(
        cli("tokenizer", "-c", config), says="data.tgt_lang must be a string, got False: quote it"
    )


def test_multiway_codes_are_checked_and_keep_the_dash_for_directions():
    with pytest.raises(ConfigError, match=r"data.multiway.languages: 'c p' is not a lang"):
        config_from_dict({"data": {"multiway": {"languages": ["en", "c p"], "train": "{lang}"}}})
    with pytest.raises(ConfigError, match="'pt-BR' has a -, which separates the languages"):
        config_from_dict({"data": {"multiway": {"languages": ["en", "pt-BR"], "train": "{lang}"}}})


def test_accepted_codes_make_tags_of_one_piece(tmp_path, corpus):
    """BCP 47's pt-BR, NLLB's deu_Latn and the longest code allowed are each one piece
    of the trained tokenizer, as a multilingual model needs its tags to be."""
    longest = "a" * 35
    train = _two_corpora(corpus, {"tgt_lang": "pt-BR"}, {"tgt_lang": "deu_Latn"})
    train.append({**train[0], "tgt_lang": longest})
    config = write_config(tmp_path, corpus, data={"train": train, "valid": None, "test": None})
    assert cli("tokenizer", "-c", config).exit_code == 0
    cfg = config_from_dict(yaml.safe_load(config.read_text()))
    assert tags(cfg.data) == ["<2aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa>", "<2deu_Latn>", "<2pt-BR>"]
    vocab, _ = load_vocabs(cfg.run_path, joint=True)
    for code in ("pt-BR", "deu_Latn", longest):
        pieces = [vocab.piece(i) for i in vocab.encode([f"{tag(code)} a man"])[0]]
        assert tag(code) in pieces, pieces


def test_check_language_code_is_one_line_naming_the_option():
    assert check_language_code("pt-BR", "--lang") == "pt-BR"
    with pytest.raises(OptionError, match=r"^--lang 'c p' is not a language code") as e:
        check_language_code("c p", "--lang")
    assert e.value.option is None
    with pytest.raises(OptionError, match="^--tgt-lang '' is not a language code") as e:
        check_language_code("", field="tgt_lang")
    assert e.value.option == "tgt_lang"
    with pytest.raises(OptionError) as e:  # 600 KB of it is not echoed back
        check_language_code("x " * 300_000)
    assert len(str(e.value)) < 200


def test_a_requested_target_language_is_checked_before_the_model_is_asked():
    multi = config_from_dict(
        {"data": {"train": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "c", "tgt_lang": "fr"}]}}
    )
    with pytest.raises(OptionError, match="^--tgt-lang 'c p' is not a language code"):
        check_target(multi.data, "c p")
    with pytest.raises(OptionError, match="^target_lang '' is not a language code") as e:
        check_target(multi.data, "", "target_lang")
    assert e.value.option == "tgt_lang"
    assert check_target(multi.data, "fr") == "<2fr> "


def test_run_without_a_test_set_stops_before_the_tokenizer(tmp_path, corpus):
    config = tmp_path / "exp.yaml"
    data = tiny_config_dict(corpus, tmp_path / "run")
    del data["data"]["test"]
    config.write_text(yaml.safe_dump(data))
    assert_one_line(
        cli("run", "-c", config),
        says="config error: data.test is not set: `mtkit run` ends by translating",
    )
    assert not (tmp_path / "run").exists()  # no tokenizer, no shards, no training


def test_run_without_a_test_set_on_a_trained_run_stops_before_training(work):
    config = yaml.safe_load((work / "exp.yaml").read_text())
    del config["data"]["test"]
    (work / "nt.yaml").write_text(yaml.safe_dump(config))
    before = snapshot(work)
    result = cli("run", "-c", work / "nt.yaml", "--set", "train.max_steps=1000")
    assert_one_line(result, says="config error: data.test is not set")
    assert snapshot(work) == before


def test_run_preprocesses_again_when_data_test_was_added_after_preprocessing(work):
    """Shards made while the config had no test set: `mtkit run` makes them again (the
    same train shards) instead of failing after training."""
    shutil.rmtree(work / "run" / "data" / "test")
    result = cli("run", "-c", work / "exp.yaml")
    assert result.exit_code == 0, result.output
    assert (work / "run" / "data" / "test" / "manifest.json").exists()
    assert len((work / "run" / "test.hyp").read_text("utf-8").splitlines()) == 100


def test_the_summary_before_the_first_validation_shows_no_score():
    before = TrainResult(
        step=3, epoch=1, best_bleu=-1.0, stopped_because="signal SIGTERM", run_dir=None
    )
    assert "-1.00" not in before.summary()
    assert before.summary() == "stopped at step 3 (signal SIGTERM); not validated yet"
    after = TrainResult(step=10, epoch=1, best_bleu=0.0, stopped_because="max_steps", run_dir=None)
    assert after.summary().endswith("best valid BLEU 0.00")

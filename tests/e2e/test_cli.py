"""The command chain through Typer's CliRunner on a 2,000-pair slice of Multi30k."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from mtkit.cli import app

from conftest import tiny_config_dict

runner = CliRunner()


def write_config(tmp_path, corpus, **sections):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict(corpus, tmp_path / "run", **sections)))
    return path


def test_tokenizer_then_preprocess(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    result = runner.invoke(app, ["tokenizer", "--config", str(config)])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    assert (run / "spm.model").stat().st_size > 0 and (run / "spm.vocab").exists()
    result = runner.invoke(app, ["preprocess", "-c", str(config), "--set", "data.max_len=30"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((run / "data" / "train" / "manifest.json").read_text())
    assert manifest["dropped"]["length"] > 0 and manifest["pairs"] + sum(
        manifest["dropped"].values()) == 2000
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["max_len"] == 30
    for split in ("valid", "test"):
        assert json.loads((run / "data" / split / "manifest.json").read_text())["pairs"] == 100


def test_config_typo_is_one_line_and_exit_2(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    result = runner.invoke(app, ["tokenizer", "-c", str(config), "--set", "model.dmodel=8"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"config error: {config}: model.dmodel is not a key; "
                                      f"did you mean model.d_model?")


def test_mismatched_corpus_is_one_line_and_writes_nothing(tmp_path, corpus):
    short = tmp_path / "short.de"
    short.write_text("eins\nzwei\n")
    config = write_config(tmp_path, corpus)
    result = runner.invoke(app, ["tokenizer", "-c", str(config), "--set",
                                 f"data.train.tgt={short}"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: line counts differ: {corpus['train.en']} has "
                                      f"2000 lines, {short} has 2")
    assert not (tmp_path / "run" / "spm.model").exists()


def test_preprocess_before_tokenizer_says_what_to_run(tmp_path, corpus):
    result = runner.invoke(app, ["preprocess", "-c", str(write_config(tmp_path, corpus))])
    assert result.exit_code == 2 and "run `mtkit tokenizer` first" in result.output


def test_vocab_too_large_is_one_line(tmp_path, corpus):
    config = write_config(tmp_path, corpus, tokenizer={"vocab_size": 90000})
    result = runner.invoke(app, ["tokenizer", "-c", str(config)])
    assert result.exit_code == 2
    assert result.output.startswith("error: tokenizer.vocab_size=90000 cannot be trained")
    assert len(result.output.strip().splitlines()) == 1


def test_every_design_command_is_registered_with_help():
    result = runner.invoke(app, ["--help"])
    for command in ("tokenizer", "preprocess", "train", "translate", "eval", "average", "run"):
        assert command in result.output
        assert runner.invoke(app, [command, "--help"]).exit_code == 0

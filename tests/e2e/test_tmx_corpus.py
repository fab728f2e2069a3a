"""A TMX translation memory as training data, through `mtkit preprocess`: the same
shards as the same pairs given as two text files."""

from __future__ import annotations

import gzip
import json

from translate.storage.tmx import tmxfile
from typer.testing import CliRunner

from mtkit.cli import app

from conftest import write_config

runner = CliRunner()


def test_preprocess_on_a_tmx_writes_the_shards_of_the_same_pairs_as_text_files(tmp_path, corpus):
    en = corpus["train.en"].read_text(encoding="utf-8").splitlines()
    de = corpus["train.de"].read_text(encoding="utf-8").splitlines()
    store = tmxfile(sourcelanguage="en-GB", targetlanguage="de-DE")
    for i, (src, tgt) in enumerate(zip(en, de, strict=True)):
        store.addtranslation(src, "en-GB", tgt, "de-DE")
        if i % 500 == 0:  # units missing a side, among the others: dropped and counted
            store.addsourceunit(f"no German for unit {i}")
            store.addtranslation(f"an empty German side {i}", "en-GB", "", "de-DE")
    memory = tmp_path / "train.tmx.gz"
    memory.write_bytes(gzip.compress(bytes(store)))

    runs = {}
    for name, data in (
        ("text", {}),  # the config's train.en and train.de
        ("tm", {"train": {"path": str(memory)}}),
    ):
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, corpus, data=data)
        for command in ("tokenizer", "preprocess"):
            result = runner.invoke(app, [command, "-c", str(config)])
            assert result.exit_code == 0, result.output
        runs[name] = tmp_path / name / "run"
    # the same sentences sampled, so the same tokenizer, and the same ids in the shards
    assert (runs["tm"] / "spm.model").read_bytes() == (runs["text"] / "spm.model").read_bytes()
    text, tm = runs["text"] / "data" / "train", runs["tm"] / "data" / "train"
    for name in ("src.bin", "tgt.bin", "src.idx", "tgt.idx"):
        assert (tm / name).read_bytes() == (text / name).read_bytes()
    by_text, by_tm = (json.loads((x / "manifest.json").read_text()) for x in (text, tm))
    assert by_tm["pairs"] == by_text["pairs"] > 1900
    assert by_tm["corpora"][0]["read"] == by_text["corpora"][0]["read"] + 8 == 2008
    assert by_tm["dropped"] == {**by_text["dropped"], "empty": by_text["dropped"]["empty"] + 8}


def test_a_malformed_tmx_is_one_line_and_exit_2(tmp_path, corpus):
    memory = tmp_path / "train.tmx"
    memory.write_text(
        '<?xml version="1.0"?>\n<tmx version="1.4"><header/><body>\n'
        '<tu><tuv xml:lang="en"><seg>a</seg></tuv><tuv xml:lang="de"><seg>b</seg></tuv></tu>\n'
        '<tu><tuv xml:lang="en"><seg>a</tuv></tu>\n'
        "</body></tmx>\n"
    )
    config = write_config(tmp_path, corpus, data={"train": {"path": str(memory)}})
    result = runner.invoke(app, ["tokenizer", "-c", str(config)])
    assert result.exit_code == 2
    assert result.output == (
        f"error: {memory}: malformed XML at line 4: Opening and ending tag mismatch: "
        f"seg line 4 and tuv\n"
    )
    assert not (tmp_path / "run" / "spm.model").exists()

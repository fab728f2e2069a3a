"""Stages check that their inputs belong together, and corrupt shards are detected."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from mtkit.data.shards import ShardDataset
from mtkit.data.sources import DataError

from faultkit import assert_one_line, cli, snapshot


def test_a_retrained_tokenizer_makes_train_ask_for_preprocess(work):
    config, run = work / "exp.yaml", work / "run"
    assert cli("tokenizer", "-c", config, "--set", "tokenizer.vocab_size=300").exit_code == 0
    before = snapshot(run / "checkpoints", run / "data")
    for stage in ("train", "run"):
        assert_one_line(
            cli(stage, "-c", config),
            says="encoded with another tokenizer than the run's spm model "
            "(the tokenizer was retrained after preprocessing); rerun "
            "`mtkit preprocess`",
        )
    assert snapshot(run / "checkpoints", run / "data") == before


def test_checkpoints_refuse_to_resume_on_shards_made_again(work):
    config, run = work / "exp.yaml", work / "run"
    result = cli("preprocess", "-c", config, "--set", "data.max_len=30")
    assert result.exit_code == 0, result.output
    before = snapshot(run / "checkpoints")
    line = assert_one_line(
        cli("train", "-c", config, "--set", "data.max_len=30"),
        says="was trained on other data or another tokenizer",
    )
    assert line.endswith("start over with --no-resume, or use another run_dir")
    assert snapshot(run / "checkpoints") == before
    # the fingerprint is in the checkpoint, and --no-resume starts over
    result = cli(
        "train",
        "-c",
        config,
        "--set",
        "data.max_len=30",
        "--no-resume",
        "--set",
        "train.max_steps=2",
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "name, says",
    [("tgt.bin", "tgt.bin: "), ("src.idx", "src.idx: "), ("manifest.json", "manifest.json: ")],
)
def test_truncated_shard_files_are_one_line_naming_the_file(work, name, says):
    config, run = work / "exp.yaml", work / "run"
    path = run / "data" / "train" / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = snapshot(run)
    for args in (("train", "-c", config), ("preprocess", "-c", config, "--verify")):
        line = assert_one_line(cli(*args), says=says)
        assert "rerun `mtkit preprocess`" in line
    assert snapshot(run) == before


def test_a_flipped_byte_in_a_shard_is_caught_by_the_checksum(work):
    config, run = work / "exp.yaml", work / "run"
    assert cli("preprocess", "-c", config, "--verify").exit_code == 0
    path = run / "data" / "train" / "src.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    before = snapshot(run)
    for args in (("train", "-c", config), ("preprocess", "-c", config, "--verify")):
        assert_one_line(cli(*args), says="src.bin: checksum mismatch")
    assert snapshot(run) == before


def test_offsets_inconsistent_with_the_data_are_caught_at_open(work):
    folder = work / "run" / "data" / "valid"
    offsets = np.fromfile(folder / "tgt.idx", dtype=np.int64)
    offsets[[3, 4]] = offsets[[4, 3]]  # same size, no longer increasing
    offsets.tofile(folder / "tgt.idx")
    with pytest.raises(DataError, match=r"tgt.idx: offsets do not match the data"):
        ShardDataset(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["pairs"] += 1  # a manifest that disagrees with the files
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"src.idx: offsets do not match the data"):
        ShardDataset(folder)
    (folder / "manifest.json").write_text('{"format": "mtkit-shards-2"}')
    with pytest.raises(DataError, match=r"corrupt manifest"):
        ShardDataset(folder)


def test_leftovers_of_a_killed_preprocess_are_removed_by_the_next_one(work):
    run = work / "run"
    (run / ".data.abc123.partial" / "train").mkdir(parents=True)
    (run / ".data.abc123.partial" / "train" / "src.bin").write_bytes(b"\0" * 100)
    (run / ".data.old").mkdir()
    result = cli("preprocess", "-c", work / "exp.yaml")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".data")) == []


def test_preprocess_killed_mid_way_then_rerun_writes_the_same_shards(work):
    """SIGKILL right after the first chunk of train reached the shard files."""
    run = work / "run"
    finished = {
        s: json.loads((run / "data" / s / "manifest.json").read_text())["files"]
        for s in ("train", "valid", "test")
    }  # from one uninterrupted preprocess
    shutil.rmtree(run / "data")
    killer = (
        "import os, signal, sys\n"
        "from mtkit.data import shards\n"
        "append = shards.ShardWriter.append\n"
        "def append_then_die(self, chunk, keep):\n"
        "    append(self, chunk, keep)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "shards.ShardWriter.append = append_then_die\n"
        "from mtkit.cli import app\n"
        "app(['preprocess', '-c', sys.argv[1]])\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", killer, str(work / "exp.yaml")], capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = [p for p in run.iterdir() if p.name.startswith(".data.")]
    assert partial and (partial[0] / "train" / "src.bin").stat().st_size > 0
    assert not (run / "data").exists()  # nothing a later stage could take for finished
    with pytest.raises(DataError, match=r"no finished shard here"):
        ShardDataset(partial[0] / "train")
    assert cli("preprocess", "-c", work / "exp.yaml").exit_code == 0
    again = {
        s: json.loads((run / "data" / s / "manifest.json").read_text())["files"]
        for s in ("train", "valid", "test")
    }
    assert again == finished
    assert not [p for p in run.iterdir() if p.name.startswith(".data.")]


def test_corpora_whose_sides_differ_stop_before_anything_is_written(work, corpus):
    short = work / "short.de"
    short.write_text("".join(corpus["train.de"].read_text().splitlines(True)[:1999]))
    before = snapshot(work / "run")
    config = work / "exp.yaml"
    extra = (
        f"data.train=[{{src: {corpus['train.en']}, tgt: {corpus['train.de']}}}, "
        f"{{src: {corpus['train.en']}, tgt: {short}, weight: 2}}]"
    )
    assert_one_line(
        cli("preprocess", "-c", config, "--set", extra),
        says=f"error: line counts differ: {corpus['train.en']} has 2000 lines, {short} has 1999",
    )
    assert snapshot(work / "run") == before


def test_a_valid_pair_longer_than_the_positions_does_not_stop_training(work, corpus):
    valid = work / "long.en"
    lines = corpus["valid.en"].read_text().splitlines()
    valid.write_text("\n".join([" ".join(lines[:20])] + lines[1:]) + "\n")  # ~250 subwords
    config = work / "exp.yaml"
    args = (
        "--set",
        "data.max_len=30",
        "--set",
        "model.max_positions=32",
        "--set",
        f"data.valid.src={valid}",
    )
    assert cli("preprocess", "-c", config, *args).exit_code == 0
    result = cli("train", "-c", config, *args, "--no-resume", "--set", "train.max_steps=10")
    assert result.exit_code == 0, result.output
    assert "valid | step 10" in result.stderr


def _bad_utf8(work):
    """valid.en with its end replaced by invalid UTF-8: 112 lines for valid.de's 100."""
    (work / "bad.en").write_bytes((work / "valid.en").read_bytes()[:-40] + b"\xff\xfe\n" * 13)


@pytest.mark.parametrize(
    "stage, sets, setup, says",
    [
        (
            "tokenizer",
            ["data.train.tgt=in.txt"],
            None,
            "error: line counts differ: ",  # the config's train.en has 2000, in.txt 2
        ),
        ("preprocess", ["data.valid.src=no.en"], None, "error: no.en: no such file"),
        ("preprocess", ["data.valid.src=bad.en"], _bad_utf8, "error: line counts differ: bad.en"),
        (
            "tokenizer",
            ["data.train.src=t.gz", "data.train.tgt=t.gz"],
            lambda w: (w / "t.gz").write_bytes(gzip.compress((w / "train.en").read_bytes())[:3000]),
            "error: t.gz: corrupt or truncated gzip data at line",
        ),
        (
            "tokenizer",
            ["data.train.src=", "data.train.tgt=", "data.train.path=x.tsv"],
            lambda w: (w / "x.tsv").write_text("src\ttgt\na\tb\tc\nd\te\n"),
            "error: x.tsv: the first row has more tab-separated fields than the header",
        ),
        (
            "tokenizer",
            ["data.train.src=e.txt", "data.train.tgt=e.txt"],
            lambda w: (w / "e.txt").write_text("\n\n"),
            "error: e.txt + e.txt: no pairs left after cleaning",
        ),
    ],
    ids=["line-counts", "missing", "invalid-utf8", "truncated-gz", "tsv-extra-field", "empty"],
)
def test_a_corpus_that_cannot_be_used_is_one_line_and_nothing_is_written(
    work, corpus, monkeypatch, stage, sets, setup, says
):
    for name in ("train.en", "valid.en"):
        shutil.copy(corpus[name], work / name)
    (work / "in.txt").write_text("A dog.\nTwo men.\n")
    if setup:
        setup(work)
    monkeypatch.chdir(work)
    before = snapshot(work, skip=(".lock", "cache"))
    overrides = [x for s in sets for x in ("--set", s)]
    line = assert_one_line(cli(stage, "-c", "exp.yaml", *overrides), says=says)
    assert "in.txt has 2" in line if "in.txt" in sets[0] else True
    assert snapshot(work, skip=(".lock", "cache")) == before


def test_a_garbage_manifest_is_one_line(work):
    config, run = work / "exp.yaml", work / "run"
    (run / "data" / "train" / "manifest.json").write_text("{garbage")
    before = snapshot(run)
    for args in (("train", "-c", config), ("preprocess", "-c", config, "--verify")):
        assert_one_line(cli(*args), says="manifest.json")
    assert snapshot(run) == before

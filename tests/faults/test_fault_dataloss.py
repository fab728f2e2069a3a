"""Data is never lost or silently wrong: `export --force` replaces
only a previous export, no output overwrites a file the run reads, devices and FIFOs are
written in place, a config in its own run directory is kept, exported folders are
checked, every split the config names is verified, huge length limits are capped."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import threading

import pytest
import yaml

from conftest import tiny_config_dict
from faultkit import assert_one_line, cli, snapshot

LINES = "A dog runs in the park.\n\nTwo men talk on a bench.\n"


@pytest.fixture
def ckpts(work):
    return work / "run" / "checkpoints"


@pytest.fixture
def export_copy(exported, tmp_path):
    shutil.copytree(exported, tmp_path / "ct2")
    return tmp_path / "ct2"


# 1. export --force replaces only a previous export


def test_export_force_never_replaces_a_folder_that_is_not_an_export(
    work, ckpts, exported, monkeypatch
):
    best, run = ckpts / "best.pt", work / "run"
    shutil.copy(best, work / "b.pt")
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("my notes\n")
    shutil.copytree(exported, work / "export+notes")
    (work / "export+notes" / "notes.txt").write_text("kept beside the export\n")
    monkeypatch.chdir(work)
    before = snapshot(work)
    for model, out, says in (
        (best, ckpts, "holds the checkpoint"),  # every checkpoint was deleted
        (best, run, "holds the checkpoint"),  # the run directory was deleted
        (work / "b.pt", run, "holds checkpoints and"),
        (work / "b.pt", work / "mine", "holds notes.txt, which an export does not"),
        (work / "b.pt", work / "export+notes", "holds notes.txt"),
        (best, ".", "is the current folder"),  # was a ValueError traceback
        (best, work.parent, "is the current folder or one above it"),
        (best, "-", "an export is a folder"),
    ):
        line = assert_one_line(cli("export", "-m", model, "-o", out, "--force"), says=says)
        assert line.startswith("error: ")
    assert snapshot(work) == before
    assert not [p for p in work.iterdir() if p.name.startswith(".")]  # no temporaries


def test_export_force_replaces_a_previous_export(trained, export_copy):
    best = trained / "run" / "checkpoints" / "best.pt"
    (export_copy / "model.bin").write_bytes(b"an old, damaged model")
    result = cli("export", "-m", best, "-o", export_copy, "--force")
    assert result.exit_code == 0, result.output
    assert cli("translate", "-m", export_copy, input=LINES).exit_code == 0


# 2. translate -o is none of the files the run reads


def test_translate_never_writes_over_a_file_of_the_exported_model(export_copy, tmp_path):
    (tmp_path / "in.txt").write_text(LINES)
    os.link(export_copy / "model.bin", tmp_path / "linked.bin")
    before = snapshot(tmp_path)
    for out in [*sorted(export_copy.iterdir()), tmp_path / "linked.bin"]:
        assert_one_line(
            cli("translate", "-m", export_copy, "-i", tmp_path / "in.txt", "-o", out),
            says="is the same file as --model",
        )
    assert snapshot(tmp_path) == before


def test_translate_never_writes_over_its_prefix_file_or_a_second_model(work, ckpts):
    text, prefixes = work / "in.txt", work / "prefixes.txt"
    text.write_text("A dog.\nTwo men.\n")
    prefixes.write_text("Ein\nZwei\n")
    before = snapshot(work)
    assert_one_line(
        cli(
            "translate",
            "-m",
            ckpts / "best.pt",
            "-i",
            text,
            "--prefix-file",
            prefixes,
            "-o",
            prefixes,
        ),
        says="is the same file as --prefix-file",
    )
    assert_one_line(
        cli(
            "translate",
            "-m",
            ckpts / "best.pt",
            "-m",
            ckpts / "last.pt",
            "-i",
            text,
            "-o",
            ckpts / "last.pt",
        ),
        says="is the same file as --model #2",
    )
    assert snapshot(work) == before


# 3. devices, FIFOs and descriptors are written in place; - is stdin / stdout


def test_dash_is_stdin_and_stdout(work, ckpts, monkeypatch):
    monkeypatch.chdir(work)
    before = snapshot(work)
    result = cli("translate", "-m", ckpts / "best.pt", "-i", "-", "-o", "-", input=LINES)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3 and result.stdout.splitlines()[0]
    assert not (work / "-").exists()
    assert snapshot(work) == before


def test_average_dash_is_stdout(work, ckpts, monkeypatch, capfdbinary):
    monkeypatch.chdir(work)
    before = snapshot(work)
    capfdbinary.readouterr()
    result = cli("average", ckpts / "step_10.pt", ckpts / "step_20.pt", "-o", "-")
    assert result.exit_code == 0, result.output
    assert capfdbinary.readouterr().out.startswith(b"PK")  # the checkpoint's zip, on fd 1
    assert not (work / "-").exists()
    assert snapshot(work) == before


def test_a_device_or_a_fifo_as_output_is_written_in_place(work, ckpts, capfd):
    text = work / "in.txt"
    text.write_text(LINES)
    for args in (
        ["translate", "-m", ckpts / "best.pt", "-i", text, "-o", os.devnull],
        ["average", ckpts / "step_10.pt", ckpts / "step_20.pt", "-o", os.devnull],
    ):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # was replaced by a regular file
    fifo = work / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    result = cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", fifo)
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert len(got[0].decode().splitlines()) == 3
    capfd.readouterr()
    result = cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", "/dev/stdout")
    assert result.exit_code == 0, result.output
    assert len(capfd.readouterr().out.splitlines()) == 3  # through file descriptor 1
    assert sorted(p.name for p in work.iterdir()) == ["exp.yaml", "in.txt", "pipe", "run"]


def test_an_output_descriptor_that_is_an_input_is_refused(work, ckpts):
    text = work / "in.txt"
    text.write_text(LINES)
    before = snapshot(work)
    with open(text, "ab") as f:  # as `mtkit translate -i in.txt -o /dev/fd/N N>>in.txt`
        assert_one_line(
            cli("translate", "-m", ckpts / "best.pt", "-i", text, "-o", f"/dev/fd/{f.fileno()}"),
            says="is the same file as --input",
        )
    assert snapshot(work) == before


# 4. RUN/config.yaml is never written over the config given with -c


def test_a_config_in_its_own_run_directory_is_kept(corpus, tmp_path, monkeypatch):
    data = tiny_config_dict(corpus, tmp_path, tokenizer={"vocab_size": 200})
    data["run_dir"] = "."
    config = tmp_path / "config.yaml"
    config.write_text(
        "# my experiment: comments the resolved config would lose\n" + yaml.safe_dump(data)
    )
    os.symlink(config, tmp_path / "link.yaml")
    monkeypatch.chdir(tmp_path)
    before = snapshot(config)
    for stage, given in (("tokenizer", "config.yaml"), ("preprocess", "./link.yaml")):
        result = cli(stage, "-c", given)
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        assert "the resolved config is not written to config.yaml" in result.stderr
        assert snapshot(config) == before
    from mtkit.core.config import load_config, save_config  # as training saves it

    save_config(load_config(config, ["train.max_steps=3"]), tmp_path / "config.yaml")
    assert snapshot(config) == before


def test_run_with_a_config_in_its_own_run_directory_keeps_it(work, corpus, monkeypatch):
    """`mtkit run` through every stage, each of which would have written the resolved
    config over the user's commented one (the copy of the trained run: a resume)."""
    config = yaml.safe_load((work / "exp.yaml").read_text())
    config["run_dir"] = "."
    (work / "run" / "self.yaml").write_text("# my experiment\n" + yaml.safe_dump(config))
    monkeypatch.chdir(work / "run")
    before = snapshot(work / "run" / "self.yaml")
    result = cli("run", "-c", "self.yaml")
    assert result.exit_code == 0, result.output
    assert snapshot(work / "run" / "self.yaml") == before


def test_a_config_elsewhere_still_gets_its_resolved_copy(work):
    (work / "run" / "config.yaml").unlink()
    assert cli("tokenizer", "-c", work / "exp.yaml").exit_code == 0
    assert yaml.safe_load((work / "run" / "config.yaml").read_text())["run_dir"] == str(
        work / "run"
    )


# 5. exported folders are checked, every file, each fault one line naming it


def test_an_export_records_every_file_size_and_checksum(exported):
    from mtkit.core.checksum import file_sha256

    files = json.loads((exported / "mtkit.json").read_text())["files"]
    assert set(files) == {p.name for p in exported.iterdir()} - {"mtkit.json"}
    for name, entry in files.items():
        assert entry == {
            "bytes": (exported / name).stat().st_size,
            "sha256": file_sha256(exported / name),
        }


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 4
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, name, says",
    [
        (
            lambda p: p.write_bytes(p.read_bytes()[:1000]),
            "model.bin",
            "1000 bytes, mtkit.json says",
        ),
        (_flip, "model.bin", "SHA-256 does not match mtkit.json"),
        (_flip, "source.spm", "SHA-256 does not match mtkit.json"),
        (lambda p: p.unlink(), "shared_vocabulary.json", "missing from the export"),
        (lambda p: p.write_text("{}"), "config.json", "bytes, mtkit.json says"),
    ],
)
def test_a_damaged_export_is_one_line_naming_the_file(export_copy, damage, name, says):
    damage(export_copy / name)
    before = snapshot(export_copy)
    for command in ("translate", "serve"):
        if command == "serve":
            pytest.importorskip("fastapi")
        line = assert_one_line(cli(command, "-m", export_copy, input="A dog.\n"), says=says)
        assert str(export_copy / name) in line
    assert snapshot(export_copy) == before


def test_an_export_of_an_older_mtkit_is_refused_in_one_line(export_copy):
    manifest = json.loads((export_copy / "mtkit.json").read_text())
    del manifest["files"]  # as mtkit wrote it before it recorded them
    (export_copy / "mtkit.json").write_text(json.dumps(manifest))
    assert_one_line(
        cli("translate", "-m", export_copy, input="A dog.\n"),
        says=f"{export_copy / 'mtkit.json'}: no list of files (an older mtkit's); export",
    )
    (export_copy / "mtkit.json").write_text(json.dumps({**manifest, "format": "mtkit-ct2-0"}))
    assert_one_line(
        cli("translate", "-m", export_copy, input="A dog.\n"),
        says="export format mtkit-ct2-0, which this mtkit does not read (it reads mtkit-ct2-1)",
    )


# 6. preprocess --verify: every split the config names


def test_verify_fails_on_a_missing_split_the_config_names(work):
    shutil.rmtree(work / "run" / "data" / "valid")
    before = snapshot(work)
    assert_one_line(
        cli("preprocess", "-c", work / "exp.yaml", "--verify"),
        says="data/valid: missing, but the config names data.valid",
    )
    assert snapshot(work) == before
    result = cli(
        "preprocess",
        "-c",
        work / "exp.yaml",
        "--verify",
        "--set",
        "data.valid.src=",
        "--set",
        "data.valid.tgt=",
    )  # a config without validation data
    assert result.exit_code == 0 and "verified train, test:" in result.stderr


# 7. huge length limits mean "as long as the model's positions allow"


def test_huge_length_limits_are_capped_at_the_models_positions(work, ckpts):
    from mtkit.core.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(ckpts / "best.pt")  # 48 positions: outputs of 47 tokens at most
    payload["config"]["model"]["max_positions"] = 48  # (the sinusoids are not stored)
    payload["config"]["data"]["max_len"] = 40  # (must fit the positions)
    save_checkpoint(payload, work / "short.pt")
    models = [work / "short.pt"]
    if importlib.util.find_spec("ctranslate2"):
        assert cli("export", "-m", work / "short.pt", "-o", work / "short").exit_code == 0
        models.append(work / "short")
    for model in models:
        capped = cli(
            "translate", "-m", model, "--beam", "1", "--max-len-a", "100", input=LINES
        )  # (greedy: quick; beam search's limits: tests/unit)
        rows = capped.stdout.splitlines()
        assert capped.exit_code == 0 and len(rows) == 3 and len(rows[0].split()) > 1
        for option, value in (
            ("--max-len-a", "1e20"),
            ("--max-len-a", "1e300"),
            ("--max-len-b", "9223372036854775807"),
            ("--max-len-b", "1" + "0" * 30),
        ):
            result = cli("translate", "-m", model, "--beam", "1", option, value, input=LINES)
            assert result.exit_code == 0, result.output
            assert result.stdout == capped.stdout, (model, option, value)  # not one word

"""Faults at mtkit's borders with other toolkits: `mtkit import` of broken or foreign
Marian folders, `mtkit export --force` over folders mtkit did not write, and write
errors that must name the user's path. Each is one line on stderr, exit 2, and leaves
every file the user owns as it was."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hfmarian import marian_folder  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from mtkit.core.checkpoint import load_checkpoint  # noqa: E402

from faultkit import assert_one_line, cli, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """One tiny Marian folder as transformers writes it; tests change copies of it."""
    return marian_folder(tmp_path_factory.mktemp("hf") / "marian")


@pytest.fixture
def folder(original, tmp_path):
    return shutil.copytree(original, tmp_path / "marian")


@pytest.fixture(scope="module")
def imported(original, tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("imported") / "imported.pt"
    assert cli("import", original, "-o", checkpoint).exit_code == 0
    return checkpoint


def edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def assert_refused(folder, out, says):
    """`mtkit import FOLDER -o OUT` refused in one line naming `says`; nothing written,
    the folder untouched."""
    before = snapshot(folder)
    started = time.monotonic()
    line = assert_one_line(cli("import", folder, "-o", out), 2, says)
    assert time.monotonic() - started < 30
    assert snapshot(folder) == before
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    return line


# --- A config field of the wrong type or range, or at odds with the
# weights, is one line naming the field and its value, before anything is written.
BROKEN_CONFIGS = [
    ({"max_position_embeddings": 1}, "max_position_embeddings=1: must be an integer in [8,"),
    ({"max_position_embeddings": 10**9}, "max_position_embeddings=1000000000"),
    (
        {"encoder_attention_heads": 3, "decoder_attention_heads": 3},
        "encoder_attention_heads=3: must divide d_model (32)",
    ),
    (
        {"encoder_attention_heads": 0, "decoder_attention_heads": 0},
        "encoder_attention_heads=0: must be an integer in [1, 32]",
    ),
    ({"encoder_layers": 0}, "encoder_layers=0: must be an integer in [1, 64]"),
    ({"encoder_layers": -1}, "encoder_layers=-1: must be an integer in [1, 64]"),
    ({"decoder_layers": 200_000}, "decoder_layers=200000: must be an integer in [1, 64]"),
    ({"encoder_layers": 3}, "encoder_layers=3: the weights hold layers 0..1 (2)"),
    ({"decoder_layers": 1}, "decoder_layers=1: the weights hold layers 0..1 (2)"),
    ({"dropout": float("nan")}, "dropout=nan: must be a finite number in [0.0, 0.9]"),
    ({"attention_dropout": -0.5}, "attention_dropout=-0.5: must be a number in [0.0, 0.9]"),
    ({"activation_function": ["swish"]}, "activation_function=['swish']: must be a string"),
    ({"d_model": 32.0}, "d_model=32.0: must be an integer"),
    ({"d_model": "32"}, "d_model='32': must be an integer"),
    ({"d_model": 0}, "d_model=0: must be an integer in [1, inf]"),
    (
        {"d_model": 64, "encoder_attention_heads": 4},
        "d_model=64: the weights' shared.weight has shape (343, 32)",
    ),
    ({"encoder_ffn_dim": 128, "decoder_ffn_dim": 128}, "encoder_ffn_dim=128: the weights'"),
    ({"decoder_ffn_dim": "64"}, "decoder_ffn_dim='64': mtkit needs it equal"),
    ({"pad_token_id": "x"}, "pad_token_id='x': must be an integer"),
    ({"eos_token_id": True}, "eos_token_id=True: must be an integer"),
    ({"eos_token_id": 10**6}, "no piece for the pad id 342 or the eos id 1000000"),
    ({"eos_token_id": 1}, "must be three different pieces"),
    (
        {"share_encoder_decoder_embeddings": "false"},
        "share_encoder_decoder_embeddings='false': must be true or false",
    ),
    ({"scale_embedding": None}, "scale_embedding=None: must be true or false"),
    ({"activation_function": "x" * 10_000}, "activation_function='xxxx"),
]


@pytest.mark.parametrize(
    "changes, says",
    BROKEN_CONFIGS,
    ids=[
        next(iter(c)) + "=" + repr(v)[:12]
        for c, _ in BROKEN_CONFIGS
        for v in [next(iter(c.values()))]
    ],
)
def test_a_broken_config_is_one_line_naming_the_field(folder, tmp_path, changes, says):
    edit_config(folder, **changes)
    line = assert_refused(folder, tmp_path / "out.pt", says)
    assert len(line) < 400  # a huge value is shortened, not echoed whole


def test_broken_files_are_one_line(folder, tmp_path):
    out = tmp_path / "out.pt"
    spm = {name: (folder / name).read_bytes() for name in ("source.spm", "target.spm")}
    (folder / "target.spm").write_bytes(b"")
    assert_refused(folder, out, "target.spm: not a SentencePiece model (empty")
    (folder / "target.spm").write_bytes(spm["target.spm"])
    (folder / "source.spm").write_bytes(os.urandom(4096))
    assert_refused(folder, out, "source.spm: not a SentencePiece model (4096 bytes")
    (folder / "source.spm").write_bytes(spm["source.spm"])
    table = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(
        json.dumps({**table, **{f"extra{i}": len(table) + i for i in range(50)}})
    )
    assert_refused(
        folder, out, "vocab.json: 393 pieces, but the source embedding (shared.weight) has 343 rows"
    )


def test_a_config_that_is_not_json_is_one_line(folder, tmp_path):
    (folder / "config.json").write_bytes(b"{garbage")
    assert_refused(folder, tmp_path / "out.pt", "config.json")


def test_weights_the_config_does_not_use_are_named_and_refused(folder, tmp_path):
    weights = load_file(folder / "model.safetensors")
    d = weights["model.shared.weight"].size(1)
    extra = {
        "model.encoder.layernorm_embedding.weight": weights["model.shared.weight"][0].clone(),
        "model.decoder.layernorm_embedding.weight": weights["model.shared.weight"][1].clone(),
    }
    save_file({**weights, **extra}, folder / "model.safetensors")
    assert_refused(
        folder,
        tmp_path / "out.pt",
        "the weights hold "
        "decoder.layernorm_embedding.weight, encoder.layernorm_embedding.weight, "
        "which the config does not use",
    )
    nan = weights["model.shared.weight"].clone()
    nan[5, 0] = float("nan")
    save_file({**weights, "model.shared.weight": nan}, folder / "model.safetensors")
    assert_refused(folder, tmp_path / "out.pt", "shared.weight is not a tensor of finite floats")
    assert d == 32


def test_what_an_import_writes_loads_and_translates(folder, tmp_path):
    """The smallest configs the checks let through still give a working checkpoint; a
    language that is no code is a warning, the default taking its place."""
    edit_config(
        folder,
        max_position_embeddings=8,
        dropout=0.9,
        encoder_attention_heads=1,
        decoder_attention_heads=1,
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "c p"})
    )
    out = tmp_path / "out.pt"
    result = cli("import", folder, "-o", out)
    assert result.exit_code == 0, result.output
    assert "target_lang='c p' is not a language code" in result.stderr
    payload = load_checkpoint(out)
    assert payload["config"]["data"]["tgt_lang"] == "tgt"
    assert payload["config"]["model"]["max_positions"] == 8
    translated = cli("translate", "-m", out, "--precision", "fp32", input="A dog.\nTwo men.\n")
    assert translated.exit_code == 0, translated.output
    assert len(translated.stdout.splitlines()) == 2


def test_output_and_source_paths_are_checked_before_any_hub_lookup(folder, tmp_path, monkeypatch):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: asked.append(a) or str(folder)
    )
    before = snapshot(folder)
    assert_one_line(cli("import", folder, "-o", "-"), 2, "-o -: the import writes a checkpoint")
    (tmp_path / "existing").mkdir()
    assert_one_line(cli("import", folder, "-o", tmp_path / "existing"), 2, "is a folder")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for mistyped in ("models/opus-mt-en-de", "./opus-mt", str(tmp_path / "nowhere"), "../a/b"):
        assert_one_line(
            cli("import", mistyped, "-o", tmp_path / "out.pt"), 2, f"{mistyped}: no such folder"
        )
    assert_one_line(
        cli("import", folder / "vocab.json", "-o", tmp_path / "out.pt"),
        2,
        "a file, not a model folder",
    )
    assert asked == [] and not (tmp_path / "out.pt").exists() and snapshot(folder) == before
    assert not any((tmp_path / "existing").iterdir())


# --- --force replaces only what mtkit's marker says mtkit wrote.


@pytest.mark.parametrize("to", ["huggingface", "ctranslate2"])
def test_force_never_replaces_a_folder_mtkit_did_not_write(imported, folder, to):
    if to == "ctranslate2":
        pytest.importorskip("ctranslate2")
    before = snapshot(folder)
    assert_one_line(
        cli("export", "-m", imported, "--to", to, "-o", folder, "--force"),
        2,
        f"{folder} is not an mtkit export (no mtkit.json",
    )
    assert snapshot(folder) == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["marian"]


def test_force_never_replaces_a_folder_of_the_users_with_a_config_json(imported, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}\n")
    before = snapshot(tmp_path)
    assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", tmp_path / "mine", "--force"),
        2,
        "is not an mtkit export",
    )
    assert snapshot(tmp_path) == before


def test_force_replaces_a_marked_export_and_refuses_an_unmarked_one(imported, tmp_path):
    out = tmp_path / "hf"
    assert cli("export", "-m", imported, "--to", "huggingface", "-o", out).exit_code == 0
    manifest = json.loads((out / "mtkit.json").read_text())
    assert manifest["format"] == "mtkit-hf-1"
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {"mtkit.json"}
    (out / "model.safetensors").write_bytes(b"damaged")
    result = cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force")
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").stat().st_size > 1000
    (out / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force"),
        2,
        "holds notes.txt, which an export does not",
    )
    (out / "notes.txt").unlink()
    # An export by mtkit before the marker existed: nothing tells it from an original.
    (out / "mtkit.json").unlink()
    before = snapshot(out)
    assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force"),
        2,
        "is not an mtkit export",
    )
    assert snapshot(out) == before
    (out / "mtkit.json").write_text(json.dumps({"format": "someone-else", "files": {}}))
    assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force"),
        2,
        "is not an mtkit export",
    )
    (out / "mtkit.json").write_text(json.dumps({"format": "mtkit-hf-1"}))  # an older mtkit's
    before = snapshot(out)
    assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force"),
        2,
        "has an mtkit.json without its list of files (an older mtkit's export); --force",
    )
    assert snapshot(out) == before


def test_force_replaces_a_ctranslate2_export_by_its_marker(imported, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert cli("export", "-m", imported, "-o", out).exit_code == 0
    result = cli("export", "-m", imported, "-o", out, "--force")
    assert result.exit_code == 0, result.output  # over itself
    result = cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force")
    assert result.exit_code == 0, result.output  # one mtkit export replaces another
    assert json.loads((out / "mtkit.json").read_text())["format"] == "mtkit-hf-1"
    result = cli("export", "-m", imported, "-o", out, "--force")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "mtkit.json").read_text())["format"] == "mtkit-ct2-1"
    (out / "sub").mkdir()
    assert_one_line(cli("export", "-m", imported, "-o", out, "--force"), 2, "holds sub")


# --- A write error names the user's path, never the temporary file.


def test_a_long_output_name_is_written_not_refused_for_its_temporary(original, tmp_path):
    out = tmp_path / ("m" * 250)
    result = cli("import", original, "-o", out)
    assert result.exit_code == 0, result.output
    load_checkpoint(out)


def test_a_write_error_names_the_users_path(original, tmp_path, monkeypatch):
    import mtkit.core.atomic

    real = os.replace

    def failing(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(errno.EXDEV, "Invalid cross-device link", src, dst)
        return real(src, dst)

    monkeypatch.setattr(mtkit.core.atomic.os, "replace", failing)
    link = tmp_path / "link.pt"
    link.symlink_to(tmp_path / "target.pt")
    for out in (tmp_path / "out.pt", link):
        line = assert_one_line(
            cli("import", original, "-o", out), 2, f"invalid cross-device link while writing {out}"
        )
        assert ".tmp" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pt"]


def test_an_output_under_a_file_names_the_users_path(original, tmp_path):
    (tmp_path / "in.txt").write_text("A dog.\n")
    before = snapshot(tmp_path)
    line = assert_one_line(cli("import", original, "-o", tmp_path / "in.txt" / "out.pt"), 2)
    assert "in.txt/out.pt" in line and ".tmp" not in line
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_full_disk_or_a_read_only_folder_names_the_users_path(original, imported, tmpfs):
    full = tmpfs("16k")
    line = assert_one_line(cli("import", original, "-o", full / "out.pt"), 2, str(full / "out.pt"))
    assert ".tmp" not in line and not list(full.iterdir())
    readonly = tmpfs("1m", readonly=True)
    out = readonly / "hf"
    line = assert_one_line(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out), 2, str(out)
    )
    assert ".partial" not in line

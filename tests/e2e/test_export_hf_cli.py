"""`mtkit export --to huggingface` through the CLI: an imported Marian model exported
again translates in `transformers` as `mtkit translate` does; a model MarianMTModel cannot
express, an unknown --to and a non-empty folder without --force are one line and exit 2,
leaving no folder; --force replaces a previous export, and only that."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hfmarian import LIMIT, generate, lines, marian_folder  # noqa: E402

from mtkit.core.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

from conftest import cli, one_line_error  # noqa: E402


@pytest.fixture
def imported(tmp_path):
    checkpoint = tmp_path / "imported.pt"
    assert cli("import", marian_folder(tmp_path / "marian"), "-o", checkpoint).exit_code == 0
    return checkpoint


def test_export_to_huggingface_translates_as_mtkit_does(imported, tmp_path):
    out = tmp_path / "hf"
    result = cli("export", "-m", imported, "--to", "huggingface", "-o", out)
    assert result.exit_code == 0, result.output
    assert "exported" in result.stderr and "huggingface" in result.stderr
    sources = lines("test2016.en", 30)
    native = cli(
        "translate",
        "-m",
        imported,
        "--precision",
        "fp32",
        "--beam",
        "1",
        "--max-len-a",
        "0",
        "--max-len-b",
        LIMIT,
        input="\n".join(sources) + "\n",
    )
    assert native.exit_code == 0, native.output
    assert native.stdout.splitlines() == generate(out, sources, 1)
    one_line_error(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out),
        "exists and is not empty; add --force",
    )
    (out / "model.safetensors").write_bytes(b"an old, damaged model")
    result = cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force")
    assert result.exit_code == 0, result.output
    assert native.stdout.splitlines() == generate(out, sources, 1)
    (out / "notes.txt").write_text("mine\n")
    one_line_error(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--force"),
        "holds notes.txt, which an export does not",
    )
    assert (out / "notes.txt").read_text() == "mine\n"


def test_what_cannot_be_exported_is_one_line_and_leaves_no_folder(imported, tmp_path):
    payload = load_checkpoint(imported)
    model = payload["config"]["model"]
    save_checkpoint(
        {**payload, "config": {**payload["config"], "model": {**model, "positions": "sinusoidal"}}},
        tmp_path / "interleaved.pt",
    )
    d = model["d_model"]
    norms = {
        f"{s}_norm.{w}": (torch.ones(d) if w == "weight" else torch.zeros(d))
        for s in ("encoder", "decoder")
        for w in ("weight", "bias")
    }
    save_checkpoint(
        {
            **payload,
            "model": {**payload["model"], **norms},
            "config": {**payload["config"], "model": {**model, "norm": "pre"}},
        },
        tmp_path / "prenorm.pt",
    )
    out = tmp_path / "hf"
    for checkpoint, to, says in (
        (tmp_path / "prenorm.pt", "huggingface", "model.norm=pre: MarianMTModel is post-norm"),
        (tmp_path / "interleaved.pt", "huggingface", "model.positions=sinusoidal: "),
        (imported, "onnx", "--to must be ctranslate2 or huggingface, got 'onnx'"),
    ):
        one_line_error(cli("export", "-m", checkpoint, "--to", to, "-o", out), says)
    one_line_error(
        cli("export", "-m", imported, "--to", "huggingface", "-o", out, "--quantization", "int8"),
        "--quantization int8 is for --to ctranslate2",
    )
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

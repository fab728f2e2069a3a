"""`mtkit import` through the CLI: a Marian folder becomes a checkpoint that translates as
`transformers` does, exports to CTranslate2 and translates the same there; a Hub name
offline and not cached, and bad folders, are one line and exit 2, writing nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hfmarian import LIMIT, generate, lines, marian_folder  # noqa: E402

from conftest import cli  # noqa: E402


def test_import_translate_and_export_an_opus_mt_style_model(tmp_path):
    folder = marian_folder(tmp_path / "marian")
    checkpoint = tmp_path / "imported.pt"
    result = cli("import", folder, "-o", checkpoint)
    assert result.exit_code == 0, result.output
    sources = lines("test2016.en", 30)
    text = "\n".join(sources) + "\n"
    search = ["--beam", "1", "--max-len-a", "0", "--max-len-b", LIMIT]
    native = cli("translate", "-m", checkpoint, "--precision", "fp32", *search, input=text)
    assert native.exit_code == 0, native.output
    assert native.stdout.splitlines() == generate(folder, sources, 1)
    pytest.importorskip("ctranslate2")
    result = cli("export", "-m", checkpoint, "-o", tmp_path / "ct2")
    assert result.exit_code == 0, result.output
    exported = cli("translate", "-m", tmp_path / "ct2", *search, input=text)
    assert exported.exit_code == 0 and exported.stdout == native.stdout


def test_what_cannot_be_imported_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out.pt"
    for source, says in (
        ("Helsinki-NLP/opus-mt-xx-yy", "not in the local cache"),
        (tmp_path / "nowhere", "nowhere: no such folder"),
        (tmp_path, "no config.json"),
    ):
        result = cli("import", source, "-o", out)
        assert result.exit_code == 2, result.output
        lines_ = result.stderr.strip().splitlines()
        assert len(lines_) == 1 and says in lines_[0] and "Traceback" not in result.output
    assert not out.exists()

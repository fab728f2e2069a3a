"""The Hugging Face export (`mtkit.interop.marian_export`): a tiny random Marian model,
imported and exported again, loads in `transformers` (`MarianMTModel`, `MarianTokenizer`)
and translates as mtkit does, greedy and beam 5, shared and separate vocabularies;
importing the export gives back the checkpoint bit for bit; what MarianMTModel cannot
express is one line. Nothing is downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
import transformers  # noqa: E402
from hfmarian import LIMIT, generate, lines, marian_folder  # noqa: E402

from mtkit.core.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from mtkit.core.config import Config, ModelConfig, TokenizerConfig, config_to_dict  # noqa: E402
from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.core.vocab import Vocab, vocab_entry  # noqa: E402
from mtkit.engines.loader import load_engine  # noqa: E402
from mtkit.interop.marian_export import HFExportError, export_huggingface  # noqa: E402
from mtkit.interop.marian_import import import_marian  # noqa: E402
from mtkit.model.transformer import build_model  # noqa: E402
from mtkit.stages.tokenizer import train_sentencepiece  # noqa: E402

from conftest import read_lines  # noqa: E402


def translations(checkpoint, sources: list[str], beam: int) -> list[str]:
    engine = load_engine([checkpoint], "cpu", precision="fp32")
    opts = SearchOptions(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=LIMIT)
    return [engine.tgt_vocab.decode(h[0].tokens) for h in engine.translate(sources, opts)]


def native_checkpoint(path, scale: float = 2.0, **model) -> str:
    """A random native mtkit model (SentencePiece ids, no id table) saved as a checkpoint;
    weights x `scale`, so that outputs differ from line to line."""
    vocab = Vocab(
        train_sentencepiece(
            read_lines("train.en.gz", 300) + read_lines("train.de.gz", 300),
            TokenizerConfig(vocab_size=200),
        )
    )
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        heads=4,
        ffn_dim=64,
        dropout=0.0,
        max_positions=300,
        **model,
    )
    net = build_model(cfg, len(vocab), len(vocab))
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    save_checkpoint(
        {
            "config": config_to_dict(Config(model=cfg)),
            "vocab": vocab_entry(vocab, vocab),
            "model": net.state_dict(),
        },
        path,
    )
    return path


@pytest.mark.parametrize("shared", [True, False])
def test_an_export_translates_in_transformers_as_mtkit_does(tmp_path, shared):
    checkpoint = import_marian(
        marian_folder(tmp_path / "marian", shared=shared), tmp_path / "imported.pt"
    )
    folder = export_huggingface(checkpoint, tmp_path / "hf")
    names = {p.name for p in folder.iterdir()}
    assert ("target_vocab.json" in names) is not shared
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, info = transformers.MarianMTModel.from_pretrained(folder, output_loading_info=True)
        tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert tokenizer.separate_vocabs is not shared
    sources = lines("test2016.en", 50)
    for beam in (1, 5):
        ours = translations(checkpoint, sources, beam)
        assert generate(folder, sources, beam) == ours
    assert len({*ours}) > 10  # the outputs differ from line to line: the test can fail


@pytest.mark.parametrize("shared", [True, False])
def test_importing_an_export_gives_back_the_checkpoint_bit_for_bit(tmp_path, shared):
    first = import_marian(marian_folder(tmp_path / "marian", shared=shared), tmp_path / "first.pt")
    again = import_marian(export_huggingface(first, tmp_path / "hf"), tmp_path / "again.pt")
    a, b = load_checkpoint(first), load_checkpoint(again)
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert tensor.dtype == b["model"][name].dtype and torch.equal(tensor, b["model"][name])
    assert a["vocab"] == b["vocab"]  # SentencePiece models and id tables
    assert a["config"] == b["config"]


def test_opus_mt_ids_eos_0_unk_1_pad_last(tmp_path):
    folder = marian_folder(tmp_path / "marian")
    checkpoint = import_marian(folder, tmp_path / "imported.pt")
    exported = export_huggingface(checkpoint, tmp_path / "hf")
    assert json.loads((exported / "vocab.json").read_text()) == json.loads(
        (folder / "vocab.json").read_text()
    )
    config = json.loads((exported / "config.json").read_text())
    pad = config["vocab_size"] - 1
    assert (config["pad_token_id"], config["decoder_start_token_id"], config["eos_token_id"]) == (
        pad,
        pad,
        0,
    )
    generation = json.loads((exported / "generation_config.json").read_text())
    assert generation["bad_words_ids"] == [[pad]]


def test_a_native_model_with_split_sinusoids_exports_with_its_sentencepiece_ids(tmp_path):
    checkpoint = native_checkpoint(
        tmp_path / "native.pt", positions="sinusoidal_split", activation="gelu"
    )
    folder = export_huggingface(checkpoint, tmp_path / "hf")
    table = json.loads((folder / "vocab.json").read_text())
    sp = Vocab(load_checkpoint(checkpoint)["vocab"]["src"])
    assert [p for p, _ in sorted(table.items(), key=lambda kv: kv[1])] == ["</s>", "<unk>"] + [
        sp.piece(i) for i in range(4, len(sp))
    ] + ["<pad>"]
    # Its pad row, left out, counts in mtkit's softmax: greedy output is the same.
    sources = lines("test2016.en", 50)
    ours = translations(checkpoint, sources, 1)
    assert generate(folder, sources, 1) == ours and len({*ours}) > 10


@pytest.mark.parametrize(
    "model, says",
    [
        (
            {"norm": "pre", "positions": "sinusoidal_split"},
            "model.norm=pre: MarianMTModel is post-norm",
        ),
        (
            {},
            "model.positions=sinusoidal: MarianMTModel adds fixed sinusoids in Marian's "
            "layout (sines, then cosines) and this model interleaves",
        ),
        ({"positions": "learned"}, "model.positions=learned"),
    ],
)
def test_what_marian_cannot_express_is_one_line_and_writes_nothing(tmp_path, model, says):
    checkpoint = native_checkpoint(tmp_path / "native.pt", **model)
    with pytest.raises(HFExportError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        export_huggingface(checkpoint, tmp_path / "hf")
    assert len(str(e.value).splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["native.pt"]


def test_writing_an_export_needs_no_transformers(tmp_path):
    checkpoint = import_marian(marian_folder(tmp_path / "marian"), tmp_path / "imported.pt")
    code = (
        "import sys; sys.modules['transformers'] = None  # any import of it fails\n"
        "from mtkit.interop.marian_export import export_huggingface\n"
        f"export_huggingface({str(checkpoint)!r}, {str(tmp_path / 'hf')!r})"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "mtkit.json",
        "source.spm",
        "target.spm",
        "tokenizer_config.json",
        "vocab.json",
    ]


def test_without_safetensors_the_export_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # import fails
    with pytest.raises(HFExportError, match=r"pip install 'mtkit\[hf\]'"):
        export_huggingface(tmp_path / "any.pt", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()

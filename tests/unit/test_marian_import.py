"""Importing Marian (OPUS-MT) models (`mtkit.interop.marian_import`): tiny random
`MarianMTModel`s in the configurations OPUS-MT uses, saved with `save_pretrained`,
imported, and translated by
mtkit and by `transformers`' `generate` with the same search: the texts are identical.
Nothing is downloaded; `transformers` is a test (and benchmark) dependency only."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hfmarian import LIMIT, generate, lines, marian_folder  # noqa: E402

from mtkit.core.checkpoint import load_checkpoint  # noqa: E402
from mtkit.core.search_options import SearchOptions  # noqa: E402
from mtkit.engines.loader import load_engine  # noqa: E402
from mtkit.interop.marian_import import MarianImportError, import_marian  # noqa: E402


@pytest.mark.parametrize("activation, shared", [("swish", True), ("relu", True), ("swish", False)])
def test_an_imported_model_translates_as_transformers_does(tmp_path, activation, shared):
    folder = marian_folder(tmp_path / "marian", activation, shared)
    checkpoint = import_marian(folder, tmp_path / "imported.pt")
    engine = load_engine([checkpoint], "cpu", precision="fp32")
    sources = lines("test2016.en", 50)
    for beam in (1, 5):
        opts = SearchOptions(beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=LIMIT)
        ours = [engine.tgt_vocab.decode(h[0].tokens) for h in engine.translate(sources, opts)]
        assert ours == generate(folder, sources, beam)
    assert len({*ours}) > 10  # the outputs differ from line to line: the test can fail
    payload = load_checkpoint(checkpoint)
    assert payload["config"]["model"]["activation"] == activation
    assert payload["config"]["data"]["src_lang"] == "en"


def test_what_mtkit_cannot_import_is_one_line(tmp_path):
    folder = marian_folder(tmp_path / "marian")
    config = json.loads((folder / "config.json").read_text())
    for change, says in (
        ({"model_type": "bart"}, "model_type='bart': not a Marian model"),
        ({"decoder_ffn_dim": 128}, "decoder_ffn_dim=128: mtkit needs it equal"),
        ({"activation_function": "gelu_new"}, "activation_function='gelu_new'"),
        ({"scale_embedding": False}, "scale_embedding=False"),
    ):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(MarianImportError, match=says.replace("(", r"\(")):
            import_marian(folder, tmp_path / "out.pt")
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(MarianImportError, match="the weights file is not readable"):
        import_marian(folder, tmp_path / "out.pt")
    (folder / "vocab.json").unlink()
    with pytest.raises(MarianImportError, match="no vocab.json"):
        import_marian(folder, tmp_path / "out.pt")
    with pytest.raises(MarianImportError, match="nowhere: no such folder"):
        import_marian(tmp_path / "nowhere", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_a_target_language_tag_is_one_piece_as_marians_tokenizer_makes_it(tmp_path):
    import transformers

    from mtkit.core.vocab import Vocab
    from mtkit.interop.marian_import import id_table

    folder = marian_folder(tmp_path / "marian")
    table = json.loads((folder / "vocab.json").read_text())
    for tag in (">>fra<<", ">>deu<<"):
        table[tag] = len(table)  # as multilingual OPUS-MT models list their tags
    (folder / "vocab.json").write_text(json.dumps(table, ensure_ascii=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.MarianTokenizer.from_pretrained(folder)
    pieces, _ = id_table(table, {"eos": 0, "pad": table["<pad>"]}, folder / "vocab.json")
    vocab = Vocab((folder / "source.spm").read_bytes(), pieces)
    for text in (">>fra<< A dog runs.", "A dog runs.", ">>deu<< Two men >>fra<< talk."):
        ours = [vocab.piece(i) for i in vocab.encode([text])[0]]
        assert ours == tok.convert_ids_to_tokens(tok(text)["input_ids"])[:-1]  # no </s>
    assert vocab.encode([">>fra<< A dog."])[0][0] == pieces.index(">>fra<<")


def test_a_pytorch_model_bin_imports_as_the_safetensors_file_does(tmp_path):
    from safetensors.torch import load_file

    folder = marian_folder(tmp_path / "marian")
    first = load_checkpoint(import_marian(folder, tmp_path / "a.pt"))["model"]
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    import torch

    torch.save(weights, folder / "pytorch_model.bin")
    second = load_checkpoint(import_marian(folder, tmp_path / "b.pt"))["model"]
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)

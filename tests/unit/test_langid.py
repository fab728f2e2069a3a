"""Language identification (`mtkit.core.langid`, py3langid): the off-target rate that
`eval --lang` reports, and `data.langid_filter`, which drops training pairs whose sides
are not in their corpus's languages."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("py3langid")

from mtkit.core.config import DataConfig, config_from_dict  # noqa: E402
from mtkit.core.langid import LangIdError, _identifier, codes, detect, off_target  # noqa: E402
from mtkit.core.progress import ProgressLog  # noqa: E402
from mtkit.data.shards import ShardWriter  # noqa: E402
from mtkit.stages.preprocess import EncoderPool, _write_corpus  # noqa: E402

from conftest import read_lines  # noqa: E402

MULTI30K = ["en", "de", "fr", "cs"]


def test_captions_are_told_apart_among_the_runs_languages():
    lines = {lang: read_lines(f"test2016.{lang}.gz", 200) for lang in MULTI30K}
    for lang, texts in lines.items():
        found = detect(texts, MULTI30K)
        assert sum(x == lang for x in found) >= 196, lang  # 98% of short captions
    mixed = lines["fr"][:90] + lines["de"][:10] + ["", " "]
    off = off_target(mixed, "fr", MULTI30K)
    assert (off.off, off.scored) == (10, 100) and off.rate == pytest.approx(10.0)
    assert off.found == {"de": 10} and off.among == ("cs", "de", "en", "fr")
    assert off.text.startswith("off-target (fr) = 10.0% (10 of 100 non-empty lines: de 10)")
    assert off.json["rate"] == 10.0 and off.json["among"] == ["cs", "de", "en", "fr"]
    assert off_target(["", ""], "fr").rate == 0.0  # nothing to judge


def test_codes_and_what_the_identifier_does_not_know(monkeypatch):
    assert codes(" en, de,,fr ") == ["en", "de", "fr"] and codes(None) == []
    assert detect(["Ein Mann fährt Fahrrad."], ["pt_BR", "de"]) == ["de"]  # region dropped
    with pytest.raises(LangIdError, match="py3langid does not know cp, rv"):
        detect(["a b"], ["cp", "rv"])
    with pytest.raises(LangIdError, match="--lang xx: py3langid does not know it"):
        off_target(["a b"], "xx")  # not a silent 100%
    with pytest.raises(LangIdError, match="--lang de is not among en, fr"):
        off_target(["a b"], "de", ["en", "fr"])
    _identifier.cache_clear()
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)  # not installed
    with pytest.raises(LangIdError, match=r"pip install 'mtkit\[langid\]'"):
        detect(["a b"])
    _identifier.cache_clear()


def test_the_filter_drops_pairs_whose_sides_are_in_other_languages(vocab_en_de, tmp_path):
    """40 en-de pairs, of which 4 have their sides swapped and 3 a French target."""
    en, de, fr = (read_lines(f"train.{x}.gz", 40) for x in ("en", "de", "fr"))
    src, tgt = list(en), list(de)
    for i in (3, 9, 20, 31):
        src[i], tgt[i] = de[i], en[i]
    for i in (5, 6, 38):
        tgt[i] = fr[i]
    cfg = config_from_dict(
        {
            "data": {
                "langid_filter": True,
                "train": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "c", "tgt_lang": "fr"}],
            }
        }
    ).data
    report = _filtered(vocab_en_de, tmp_path, src, tgt, cfg)
    assert report["dropped"]["language"] == 7 and report["read"] == 40
    assert report["kept"] == 33
    plain = _filtered(vocab_en_de, tmp_path / "off", src, tgt, DataConfig())
    assert "language" not in plain["dropped"] and plain["kept"] == 40


def _filtered(vocab, folder, src, tgt, cfg) -> dict:
    from mtkit.data.sources import Corpus

    def read(size):
        yield src, tgt

    writer = ShardWriter(folder, len(vocab), texts=False)
    args = ((vocab.model_proto, None), (vocab.model_proto, None), "uint16")
    with EncoderPool(args, 1) as pool:
        report = _write_corpus(
            Corpus("mem", len(src), 1, read),
            pool,
            writer,
            cfg,
            True,
            None,
            ProgressLog(0),
            ("en", "de"),
        )
    writer.close()
    return report


@pytest.fixture(scope="module")
def vocab_en_de():
    from mtkit.core.config import TokenizerConfig
    from mtkit.core.vocab import Vocab
    from mtkit.stages.tokenizer import train_sentencepiece

    text = (
        read_lines("train.en.gz", 300)
        + read_lines("train.de.gz", 300)
        + read_lines("train.fr.gz", 300)
    )
    return Vocab(train_sentencepiece(text, TokenizerConfig(vocab_size=300)))

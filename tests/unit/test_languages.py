"""Languages of a run (`mtkit.languages`): directions, the <2xx> tags of a multilingual
run and none for a bilingual one, the tag a translation request gets, and tags as
SentencePiece pieces of their own."""

from __future__ import annotations

import pytest

from mtkit.config import config_from_dict
from mtkit.errors import OptionError
from mtkit.languages import check_target, directions, source_tag, tags, target_languages
from mtkit.tokenizer import train_sentencepiece
from mtkit.vocab import Vocab


def data(*corpora: dict):
    return config_from_dict({"data": {"src_lang": "en", "tgt_lang": "de",
                                      "train": list(corpora) or {"src": "a", "tgt": "b"}}}).data


def test_a_bilingual_run_has_no_tags_and_takes_only_its_own_language():
    bilingual = data()
    assert directions(bilingual) == [("en", "de")] and tags(bilingual) == []
    assert source_tag(bilingual.train[0], bilingual) == ""
    assert check_target(bilingual, None) == check_target(bilingual, "de") == ""
    with pytest.raises(OptionError, match="--tgt-lang fr: this model translates en into de only"):
        check_target(bilingual, "fr")


def test_a_multilingual_run_tags_each_source_with_its_target():
    multi = data({"src": "a", "tgt": "b"}, {"src": "c", "tgt": "d", "tgt_lang": "fr"},
                 {"src": "e", "tgt": "f", "src_lang": "fr", "tgt_lang": "en"})
    assert directions(multi) == [("en", "de"), ("en", "fr"), ("fr", "en")]
    assert target_languages(multi) == ["de", "en", "fr"]
    assert tags(multi) == ["<2de>", "<2en>", "<2fr>"]
    assert [source_tag(c, multi) for c in multi.train] == ["<2de> ", "<2fr> ", "<2en> "]
    assert check_target(multi, "fr") == "<2fr> "
    with pytest.raises(OptionError, match="translates into de, en, fr: give --tgt-lang"):
        check_target(multi, None)
    with pytest.raises(OptionError, match="--tgt-lang cs: this model translates into de, en"):
        check_target(multi, "cs")


def test_tags_are_single_pieces_right_after_the_fixed_specials(tiny_config):
    lines = ["a dog runs in the park", "two men talk", "<2de> a girl"] * 20
    vocab = Vocab(train_sentencepiece(lines, tiny_config.tokenizer.__class__(vocab_size=60),
                                      ["<2de>", "<2fr>"]))
    assert [vocab.piece(i) for i in (4, 5)] == ["<2de>", "<2fr>"]
    for text in ("<2fr> a dog runs", "a <2de> dog"):
        ids = vocab.encode([text])[0]
        assert [i for i in ids if i in (4, 5)] == [5 if "fr" in text else 4]  # never split
        assert vocab.decode(ids) == text  # and it round-trips

"""Languages of a run (`mtkit.core.languages`): directions, the <2xx> tags of a multilingual
run and none for a bilingual one, the tag a translation request gets, and tags as
SentencePiece pieces of their own."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from mtkit.core.config import config_from_dict, dump_config
from mtkit.core.configcheck import ConfigError
from mtkit.core.errors import OptionError
from mtkit.core.languages import (
    check_target,
    directions,
    epoch_counts,
    output_vocabularies,
    shares,
    source_tag,
    tags,
    target_languages,
)
from mtkit.core.vocab import Vocab
from mtkit.stages.tokenizer import train_sentencepiece


def data(*corpora: dict):
    return config_from_dict(
        {
            "data": {
                "src_lang": "en",
                "tgt_lang": "de",
                "train": list(corpora) or {"src": "a", "tgt": "b"},
            }
        }
    ).data


def test_a_bilingual_run_has_no_tags_and_takes_only_its_own_language():
    bilingual = data()
    assert directions(bilingual) == [("en", "de")] and tags(bilingual) == []
    assert source_tag(bilingual.train[0], bilingual) == ""
    assert check_target(bilingual, None) == check_target(bilingual, "de") == ""
    with pytest.raises(OptionError, match="--tgt-lang fr: this model translates en into de only"):
        check_target(bilingual, "fr")


def test_a_multilingual_run_tags_each_source_with_its_target():
    multi = data(
        {"src": "a", "tgt": "b"},
        {"src": "c", "tgt": "d", "tgt_lang": "fr"},
        {"src": "e", "tgt": "f", "src_lang": "fr", "tgt_lang": "en"},
    )
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
    vocab = Vocab(
        train_sentencepiece(
            lines, tiny_config.tokenizer.__class__(vocab_size=60), ["<2de>", "<2fr>"]
        )
    )
    assert [vocab.piece(i) for i in (4, 5)] == ["<2de>", "<2fr>"]
    for text in ("<2fr> a dog runs", "a <2de> dog"):
        ids = vocab.encode([text])[0]
        assert [i for i in ids if i in (4, 5)] == [5 if "fr" in text else 4]  # never split
        assert vocab.decode(ids) == text  # and it round-trips


MULTIWAY = {
    "languages": ["en", "de", "fr"],
    "train": "corpus/train.{lang}.gz",
    "valid": "corpus/val.{lang}.gz",
    "test": "corpus/test.{lang}.gz",
}


def test_multiway_is_written_out_as_one_corpus_per_direction():
    cfg = config_from_dict({"data": {"multiway": MULTIWAY}})
    assert directions(cfg.data) == [
        ("en", "de"),
        ("en", "fr"),
        ("de", "en"),
        ("de", "fr"),
        ("fr", "en"),
        ("fr", "de"),
    ]  # every ordered pair
    first = cfg.data.train[0]
    assert (first.src, first.tgt) == ("corpus/train.en.gz", "corpus/train.de.gz")
    assert directions(cfg.data, "test") == directions(cfg.data, "valid") == directions(cfg.data)
    dumped = dump_config(cfg)
    assert "multiway" not in dumped and "corpus/val.fr.gz" in dumped
    assert config_from_dict(yaml.safe_load(dumped)) == cfg  # RUN/config.yaml: the same run


def test_multiway_names_its_directions_and_zero_shot_test_directions():
    cfg = config_from_dict(
        {
            "data": {
                "multiway": {
                    **MULTIWAY,
                    "directions": ["en-de", "de-en", "en-fr", "fr-en"],
                    "test_directions": ["en-de", "de-fr", "fr-de"],
                }
            }
        }
    )
    assert directions(cfg.data) == [("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en")]
    assert directions(cfg.data, "test") == [("en", "de"), ("de", "fr"), ("fr", "de")]
    assert [source_tag(c, cfg.data) for c in cfg.data.test] == ["<2de> ", "<2fr> ", "<2de> "]


@pytest.mark.parametrize(
    ("multiway", "message"),
    [
        (
            {"directions": ["en-es"]},
            r"data.multiway.directions: 'en-es' is not a direction of "
            r"data.multiway.languages \(en, de, fr\)",
        ),
        ({"test_directions": ["en_de"]}, "data.multiway.test_directions: 'en_de' is not a direc"),
        ({"directions": "de-de"}, "'de-de' is not a direction"),
        ({"languages": ["en"]}, "data.multiway.languages must list two or more languages"),
        ({"languages": ["en", "<2x>"]}, "'<2x>' is not a language code"),
        ({"valid": "val.gz"}, r"data.multiway.valid must contain \{lang\}"),
        (
            {"directoins": []},
            "data.multiway.directoins is not a key; did you mean data.multiway.directions",
        ),
        ({"train": "", "valid": "", "test": ""}, "data.multiway gives no file pattern"),
        ({"test": "", "test_directions": ["de-fr"]}, "test_directions needs data.multiway.test"),
    ],
)
def test_multiway_mistakes_are_one_line_naming_the_key(multiway, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"data": {"multiway": {**MULTIWAY, **multiway}}})


def test_a_split_is_given_once_and_only_into_languages_the_model_has_tags_for():
    with pytest.raises(ConfigError, match="data.train and data.multiway.train: give one"):
        config_from_dict({"data": {"multiway": MULTIWAY, "train": {"src": "a", "tgt": "b"}}})
    with pytest.raises(
        ConfigError, match="data.test.0.tgt_lang cs: the training data goes into de, fr only"
    ):
        config_from_dict(
            {
                "data": {
                    "train": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "c", "tgt_lang": "fr"}],
                    "test": {"src": "a", "tgt": "d", "tgt_lang": "cs"},
                }
            }
        )


def test_temperature_moves_the_shares_towards_uniform():
    pairs = {"en-de": 1000, "en-fr": 100, "en-cs": 10}
    assert shares(pairs, 1.0) == pytest.approx(
        {"en-de": 1000 / 1110, "en-fr": 100 / 1110, "en-cs": 10 / 1110}
    )
    five = shares(pairs, 5.0)  # n ** 0.2: 3.98, 2.51, 1.58
    assert five == pytest.approx({"en-de": 0.4928, "en-fr": 0.3110, "en-cs": 0.1962}, abs=1e-4)
    for t in (1.0, 2.0, 5.0, 100.0):
        counts = epoch_counts(pairs, t)
        assert sum(counts.values()) == 1110  # an epoch keeps its size
    assert epoch_counts(pairs, 1.0) == pairs
    assert epoch_counts(pairs, 5.0) == {"en-de": 547, "en-fr": 345, "en-cs": 218}


def test_a_tag_goes_where_the_model_reads_it_and_comes_off_the_output():
    from mtkit.core.hypothesis import Hypothesis
    from mtkit.core.languages import Tagging, tag_end, tagging, untagged, without_tag

    cfg = config_from_dict(
        {
            "model": {"lang_tag": "target"},
            "data": {
                "train": [{"src": "a", "tgt": "b"}, {"src": "a", "tgt": "c", "tgt_lang": "fr"}]
            },
        }
    )
    assert tagging(cfg, "fr") == Tagging(target="<2fr> ")
    assert [source_tag(c, cfg.data, "target") for c in cfg.data.train] == ["", ""]
    assert tagging(config_from_dict({}), None) == Tagging()  # bilingual: no tag at all
    assert without_tag("<2fr> Un chien.") == "Un chien." == without_tag("Un chien.")
    tags = frozenset({4, 5})
    assert (tag_end([3, 5, 9], tags), tag_end([5, 9], tags), tag_end([9, 8, 5], tags)) == (2, 1, 0)
    # "▁ <2fr> ▁Un ▁chien": the tag is target word 0; source word 0 is a source tag
    hyp = Hypothesis([3, 5, 20, 21], -1.0, -0.5, ((0, 0), (1, 1), (2, 2)))
    assert untagged([hyp], False, tags)[0].tokens == [20, 21]
    assert untagged([hyp], False, tags)[0].alignment == ((1, 0), (2, 1))
    assert untagged([hyp], True)[0].alignment == ((0, 1), (1, 2))
    assert untagged([hyp], True)[0].tokens == hyp.tokens


def test_a_run_of_one_direction_translates_into_its_own_target():
    """Its direction, not the data section's defaults (en, de), says what it does."""
    cfg = config_from_dict(
        {
            "data": {
                "multiway": {
                    "languages": ["fr", "cs"],
                    "directions": ["fr-cs"],
                    "train": "t.{lang}",
                }
            }
        }
    )
    assert check_target(cfg.data, "cs") == "" and tags(cfg.data) == []
    with pytest.raises(OptionError, match="--tgt-lang de: this model translates fr into cs only"):
        check_target(cfg.data, "de")


class _Shards:
    """What `output_vocabularies` reads of a `ShardDataset`: each direction's pairs (one
    here, holding all its ids) and the id counts of a side of some pairs."""

    def __init__(self, sides: dict[str, tuple[list[int], list[int]]]):
        self.sides = list(sides.items())  # direction -> (source ids, target ids)

    def directions(self):
        return {d: np.array([i]) for i, (d, _) in enumerate(self.sides)}

    def id_counts(self, side: str, pairs, size: int):
        ids = self.sides[int(pairs[0])][1][0 if side == "src" else 1]
        return np.bincount(ids, minlength=size)


def test_a_language_keeps_the_pieces_its_own_text_uses_often_enough():
    """French keeps its own pieces and those both languages use (10, 11), not English's
    20 though it occurs once in French text: 1/200 of French against 40/200 of English
    is under a tenth. Both sides of every pair count for their language."""
    en = [20] * 40 + [21] * 60 + [10] * 50 + [11] * 50
    fr = [20] + [30] * 99 + [10] * 50 + [11] * 50
    shards = _Shards({"en-fr": (en[:100], fr[:100]), "fr-en": (fr[100:], en[100:])})
    cfg = data(
        {"src": "a", "tgt": "b", "src_lang": "en", "tgt_lang": "fr"},
        {"src": "b", "tgt": "a", "src_lang": "fr", "tgt_lang": "en"},
    )
    assert output_vocabularies(shards, cfg, 40) == {"fr": [10, 11, 30], "en": [10, 11, 20, 21]}
    assert output_vocabularies(shards, cfg, 40, share=0.001)["fr"] == [10, 11, 20, 30]
    assert output_vocabularies(shards, cfg, 40, tags=frozenset({10}))["fr"] == [11, 30]
    # separate vocabularies: source ids are another vocabulary's, only targets count
    assert output_vocabularies(shards, cfg, 40, joint=False) == {"fr": [20, 30], "en": [10, 11]}
    assert output_vocabularies(shards, data(), 40) == {}  # bilingual: none

from __future__ import annotations

import pytest

from mtkit.config import TokenizerConfig
from mtkit.tokenizer import (
    BOS,
    EOS,
    PAD,
    UNK,
    TokenizerError,
    Vocab,
    load_vocabs,
    train_sentencepiece,
    train_tokenizer,
)

from conftest import read_lines

EN = read_lines("train.en.gz", 1000)
DE = read_lines("train.de.gz", 1000)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab(train_sentencepiece(EN + DE, TokenizerConfig(vocab_size=400)))


def test_special_ids_are_fixed(vocab):
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    assert [vocab.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert len(vocab) == 400


def test_encode_decode_round_trip(vocab):
    sentences = EN[:50] + DE[:50]
    ids = vocab.encode(sentences)
    assert all(min(x) > EOS for x in ids)  # no specials inside a sentence
    assert [vocab.decode(x) for x in ids] == sentences


def test_decode_stops_at_eos_and_drops_specials(vocab):
    ids = vocab.encode(["A dog runs."])[0]
    assert vocab.decode([BOS] + ids + [EOS] + ids) == "A dog runs."
    assert vocab.decode([PAD, PAD]) == ""


def test_unigram_model_type_trains():
    v = Vocab(train_sentencepiece(EN, TokenizerConfig(model_type="unigram", vocab_size=300)))
    assert len(v) == 300 and v.decode(v.encode([EN[3]])[0]) == EN[3]


def test_vocab_size_the_corpus_cannot_support_is_one_line_error():
    with pytest.raises(TokenizerError, match=r"tokenizer.vocab_size=50000 cannot be trained on "
                                             r"20 sentences: .*too high"):
        train_sentencepiece(EN[:20], TokenizerConfig(vocab_size=50000))


def test_sentence_sampling_limits_the_training_input():
    small = TokenizerConfig(vocab_size=200, input_sentence_size=100)
    a = train_sentencepiece(EN, small)
    assert a == train_sentencepiece(EN, small)  # the sample follows the seed
    assert a != train_sentencepiece(EN, TokenizerConfig(vocab_size=200))


def test_separate_models_when_not_joint(tmp_path):
    cfg = TokenizerConfig(vocab_size=300, joint=False)
    paths = train_tokenizer(EN, DE, cfg, tmp_path)
    assert [p.name for p in paths] == ["spm.src.model", "spm.tgt.model"]
    assert (tmp_path / "spm.src.vocab").read_text().startswith("<pad>\t")
    src, tgt = load_vocabs(tmp_path, joint=False)
    assert src.model_proto != tgt.model_proto
    assert tgt.decode(tgt.encode([DE[0]])[0]) == DE[0]


def test_missing_model_names_the_stage_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"run `mtkit tokenizer` first"):
        load_vocabs(tmp_path, joint=True)

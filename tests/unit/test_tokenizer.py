from __future__ import annotations

import dataclasses

import pytest

from mtkit.core.config import TokenizerConfig
from mtkit.core.vocab import BOS, EOS, PAD, UNK, Vocab, load_vocabs
from mtkit.data.sources import Corpus
from mtkit.stages.tokenizer import (
    TokenizerError,
    build_tokenizer,
    sample_pairs,
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
    with pytest.raises(
        TokenizerError,
        match=r"tokenizer.vocab_size=50000 cannot be trained on "
        r"20 sentences: .*too high",
    ):
        train_sentencepiece(EN[:20], TokenizerConfig(vocab_size=50000))


def in_chunks(src, tgt, size):
    return Corpus(
        "mem",
        len(src),
        1,
        lambda _: ((src[i : i + size], tgt[i : i + size]) for i in range(0, len(src), size)),
    )


def test_the_stream_sample_follows_the_seed_not_the_chunks():
    src = EN[:300] + [""] * 5
    tgt = DE[:300] + ["x"] * 5
    everything = sample_pairs([in_chunks(src, tgt, 7)], 0, seed=1)
    a = sample_pairs([in_chunks(src, tgt, 7)], 100, seed=1)
    assert a == sample_pairs([in_chunks(src, tgt, 64)], 100, seed=1)  # same seed, same pairs
    assert a != sample_pairs([in_chunks(src, tgt, 7)], 100, seed=2)
    assert 95 <= len(a[0]) <= 100 and set(a[0]) <= set(everything[0])  # empties left out
    pairs = set(zip(*everything))
    assert all(p in pairs for p in zip(*a))  # sides stay aligned
    both = sample_pairs(
        [in_chunks(src[:150], tgt[:150], 10), in_chunks(src[150:], tgt[150:], 10)], 100, seed=1
    )
    assert both == a  # several corpora are sampled as one stream
    assert everything == tuple([" ".join(x.split()) for x in side] for side in (EN[:300], DE[:300]))
    cfg = TokenizerConfig(vocab_size=200)
    assert train_sentencepiece(a[0], cfg) == train_sentencepiece(a[0], cfg)


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


def test_the_tokenizer_is_the_same_for_the_same_seed(tiny_config, tmp_path):
    small = dataclasses.replace(tiny_config.tokenizer, input_sentence_size=600)
    models = []
    for seed, name in ((1, "a"), (1, "b"), (2, "c")):
        cfg = dataclasses.replace(
            tiny_config,
            run_dir=str(tmp_path / name),
            tokenizer=dataclasses.replace(small, seed=seed),
        )
        build_tokenizer(cfg)
        models.append((tmp_path / name / "spm.model").read_bytes())
    assert models[0] == models[1] != models[2]

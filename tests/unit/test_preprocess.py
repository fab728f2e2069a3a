"""The preprocess stage: cleaning, encoding (in worker processes), filtering and
writing every split (`mtkit.stages.preprocess`)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from mtkit.core.config import CorpusConfig, DataConfig
from mtkit.core.progress import ProgressLog
from mtkit.core.vocab import load_vocabs
from mtkit.data.shards import ShardDataset, ShardWriter
from mtkit.data.sources import Corpus, DataError, SeenHashes
from mtkit.stages.preprocess import (
    EncoderPool,
    WordCache,
    _Encoder,
    _write_corpus,
    length_filter,
    preprocess,
)
from mtkit.stages.tokenizer import build_tokenizer


def test_length_filter_gives_each_reason_its_mask():
    src, tgt = np.array([3, 30, 4, 2]), np.array([3, 3, 20, 2])
    length_ok, ratio_ok = length_filter(src, tgt, DataConfig(max_len=10, max_len_ratio=2.0))
    assert length_ok.tolist() == [True, False, False, True]
    length_ok, ratio_ok = length_filter(src, tgt, DataConfig(max_len=100, max_len_ratio=2.0))
    assert length_ok.all() and ratio_ok.tolist() == [True, False, False, True]


def test_preprocess_writes_shards_that_read_back_as_the_encoded_text(tiny_config):
    build_tokenizer(tiny_config)
    manifests = preprocess(tiny_config)
    run = tiny_config.run_path
    assert set(manifests) == {"train", "valid", "test"}
    assert (run / "config.yaml").exists()
    src_vocab, tgt_vocab = load_vocabs(run, joint=True)
    valid = ShardDataset(run / "data" / "valid")
    assert len(valid) == manifests["valid"]["pairs"] == 100
    src_text, tgt_text = valid.texts("src"), valid.texts("tgt")
    assert len(src_text) == len(tgt_text) == 100
    for i in (0, 17, 99):
        x, y = valid[i]
        assert x.tolist() == src_vocab.encode([src_text[i]])[0]
        assert y.tolist() == tgt_vocab.encode([tgt_text[i]])[0]
    train = ShardDataset(run / "data" / "train")
    assert len(train) == manifests["train"]["pairs"] > 1900
    assert train.src_lengths.sum() == manifests["train"]["src_tokens"]
    assert isinstance(train[0][0], np.ndarray) and train[0][0].dtype == np.uint16


def test_failed_preprocess_leaves_no_data_behind(tiny_config, tmp_path):
    build_tokenizer(tiny_config)
    bad = tmp_path / "empty.de"
    bad.write_text("\n" * 100)
    data = dataclasses.replace(
        tiny_config.data, test=(dataclasses.replace(tiny_config.data.test[0], tgt=str(bad)),)
    )
    cfg = dataclasses.replace(tiny_config, data=data)
    with pytest.raises(DataError, match=r"data.test: no pairs left after cleaning"):
        preprocess(cfg)
    assert not (cfg.run_path / "data").exists()
    assert not [p for p in cfg.run_path.iterdir() if p.name.startswith(".data")]


# --- the streaming writer --------------------------------------------------------------


def corpus_of(src: list[str], tgt: list[str], weight: int = 1, origin: str = "mem") -> Corpus:
    """An in-memory corpus that yields its pairs in chunks, like a file would."""

    def read(size):
        for i in range(0, len(src), size):
            yield src[i : i + size], tgt[i : i + size]

    return Corpus(origin, len(src), weight, read)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    from mtkit.core.config import TokenizerConfig
    from mtkit.core.vocab import Vocab
    from mtkit.stages.tokenizer import train_sentencepiece

    from conftest import read_lines

    text = read_lines("train.en.gz", 500) + read_lines("train.de.gz", 500)
    return Vocab(train_sentencepiece(text, TokenizerConfig(vocab_size=300)))


def write_split(
    folder, corpora, vocab, cfg=DataConfig(), train=True, dedup=False, chunk=None, workers=1
):
    pool_args = (((vocab.model_proto, None), (vocab.model_proto, None), "uint16"), workers)
    writer = ShardWriter(folder, len(vocab), texts=not train)
    seen = SeenHashes() if dedup else None
    with EncoderPool(*pool_args) as pool:
        if chunk:  # re-chunk every corpus
            corpora = [
                Corpus(c.origin, c.size, c.weight, lambda size, c=c: c.chunks(chunk))
                for c in corpora
            ]
        reports = [
            _write_corpus(c, pool, writer, cfg, train, seen, ProgressLog(0)) for c in corpora
        ]
    return writer.finish({"corpora": reports}), reports


PAIRS = (
    (
        [f"A dog number {i}." for i in range(25)]
        + [""] * 10
        + ["A dog number 3."]
        + ["word " * 40]
        + ["Two cats."]
    ),
    (
        [f"Ein Hund Nummer {i}." for i in range(25)]
        + ["x"] * 10
        + ["Ein Hund Nummer 3."]
        + ["Wort"]
        + ["Zwei Katzen."]
    ),
)


@pytest.mark.parametrize("chunk", [1, 7, 10, 1000])
def test_streamed_shards_are_the_same_at_any_chunk_size(tmp_path, vocab, chunk):
    """Chunks of 1, of a size that does not divide the split, one whose pairs are all
    dropped (ten empty sources), and the whole split at once give the same shard."""
    cfg = DataConfig(max_len=30)
    manifest, (report,) = write_split(
        tmp_path / "s", [corpus_of(*PAIRS)], vocab, cfg, dedup=True, chunk=chunk
    )
    assert report["read"] == 38 and report["kept"] == manifest["pairs"] == 26
    assert report["dropped"] == {"empty": 10, "duplicate": 1, "length": 1, "ratio": 0}
    shard = ShardDataset(tmp_path / "s")
    keep = [i for i in range(25)] + [37]
    for row, i in enumerate(keep):
        x, y = shard[row]
        assert x.tolist() == vocab.encode([PAIRS[0][i]])[0]
        assert y.tolist() == vocab.encode([PAIRS[1][i]])[0]
    assert shard.src_lengths.dtype == np.int32
    reference = write_split(tmp_path / "whole", [corpus_of(*PAIRS)], vocab, cfg, dedup=True)[0]
    assert manifest["files"] == reference["files"]


def test_a_split_of_one_pair_and_texts_for_valid(tmp_path, vocab):
    manifest, _ = write_split(
        tmp_path / "v", [corpus_of([" A  dog. "], ["Ein Hund."])], vocab, train=False
    )
    shard = ShardDataset(tmp_path / "v")
    assert len(shard) == manifest["pairs"] == 1
    assert shard.texts("src") == ["A dog."] and shard.texts("tgt") == ["Ein Hund."]
    assert shard[0][0].tolist() == vocab.encode(["A dog."])[0]


def test_worker_processes_write_the_same_shard_as_one_process(tmp_path, vocab):
    from conftest import read_lines

    src, tgt = read_lines("train.en.gz", 3000), read_lines("train.de.gz", 3000)
    one = write_split(tmp_path / "one", [corpus_of(src, tgt)], vocab, chunk=256)[0]
    two = write_split(tmp_path / "two", [corpus_of(src, tgt)], vocab, chunk=256, workers=2)[0]
    assert one["files"] == two["files"] and one["pairs"] == 3000


class _DiesWhenUnpickled:
    def __reduce__(self):
        return os._exit, (1,)  # what a worker killed mid-chunk looks like to the pool


def test_a_worker_that_dies_is_one_error_not_a_hang(vocab):
    from mtkit.stages.preprocess import EncodingError

    with EncoderPool(((vocab.model_proto, None), (vocab.model_proto, None), "uint16"), 2) as pool:
        chunks = iter([(["A dog."], ["Ein Hund."]), _DiesWhenUnpickled()])
        with pytest.raises(EncodingError, match=r"an encoding worker process died"):
            list(pool.encode(chunks, hashes=False, texts=False))


def test_weights_repeat_a_corpus_and_the_manifest_counts_each(tmp_path, vocab):
    big = corpus_of([f"Dog {i}." for i in range(7)], [f"Hund {i}." for i in range(7)], origin="big")
    small = corpus_of(["Cat.", "", "Bird."], ["Katze.", "Leer", "Vogel."], weight=3, origin="small")
    manifest, reports = write_split(tmp_path / "w", [big, small], vocab, chunk=2)
    assert [(r["origin"], r["read"], r["kept"], r["weight"], r["written"]) for r in reports] == [
        ("big", 7, 7, 1, 7),
        ("small", 3, 2, 3, 6),
    ]
    shard = ShardDataset(tmp_path / "w")
    assert len(shard) == 13
    rows = [shard[i][0].tolist() for i in range(13)]
    assert rows[7:] == vocab.encode(["Cat.", "Bird."]) * 3
    assert rows[:7] == vocab.encode([f"Dog {i}." for i in range(7)])


def test_the_encoder_writes_uint32_ids_when_asked(vocab):
    encoder = _Encoder((vocab.model_proto, None), (vocab.model_proto, None), "uint32")
    chunk = encoder((["A dog runs.", ""], ["Ein Hund rennt.", "x"]), hashes=False, texts=False)
    assert chunk.src_ids.dtype == chunk.tgt_ids.dtype == np.uint32 and chunk.empty == 1
    assert chunk.src_ids.tolist() == vocab.encode(["A dog runs."])[0]


def test_the_word_cache_encodes_exactly_as_sentencepiece(vocab):
    from conftest import read_lines

    tricky = [
        "ｈｅｌｌｏ wide",
        "x\u200by zero-width",
        "e\u0301 combining",
        "日本語 テキスト",
        "🙂 emoji",
        "Ein Mädchen, das läuft.",
        "tab\there",
        "non\u00a0breaking",
    ]
    sentences = read_lines("val.en.gz", 300) + read_lines("val.de.gz", 300) + tricky
    cache = WordCache(vocab, np.dtype(np.uint16))
    cache.MAX_WORDS = 500  # starts over a few times on the way
    for start in range(0, len(sentences), 97):
        part = sentences[start : start + 97]
        lengths, flat = cache.encode(part)
        expected = vocab.encode(part)
        assert lengths.tolist() == [len(x) for x in expected]
        assert flat.tolist() == [i for x in expected for i in x]
    assert cache.exact and 0 < len(cache._index) <= 500


def test_preprocess_of_a_list_of_corpora_reports_each_in_the_manifest(tiny_config, tmp_path):
    from conftest import read_lines

    extra = tmp_path / "extra.jsonl"
    rows = [
        {"src": e, "tgt": d}
        for e, d in zip(read_lines("val.en.gz", 40), read_lines("val.de.gz", 40), strict=True)
    ]
    extra.write_text(
        "".join(json.dumps(r) + "\n" for r in rows + rows[:5] + [{"src": "", "tgt": "x"}])
    )
    first = tiny_config.data.train[0]
    data = dataclasses.replace(
        tiny_config.data, dedup=True, train=(first, CorpusConfig(path=str(extra), weight=2))
    )
    cfg = dataclasses.replace(tiny_config, data=data)
    build_tokenizer(cfg)
    manifest = preprocess(cfg)["train"]
    a, b = manifest["corpora"]
    assert (a["origin"], a["read"], a["weight"]) == (f"{first.src} + {first.tgt}", 2000, 1)
    assert (b["origin"], b["read"], b["kept"], b["written"]) == (str(extra), 46, 40, 80)
    assert b["dropped"]["empty"] == 1 and b["dropped"]["duplicate"] == 5
    assert manifest["pairs"] == a["written"] + 80
    assert manifest["dropped"] == {f: a["dropped"][f] + b["dropped"][f] for f in a["dropped"]}
    assert manifest["origin"] == f"{a['origin']} and {extra}"
    shard = ShardDataset(cfg.run_path / "data" / "train")
    assert shard[a["written"]][0].tolist() == shard[a["written"] + 40][0].tolist()


def test_the_manifest_gives_each_direction_its_pairs_and_share(tiny_config, tmp_path):
    """Three corpora, two of them en->de (one weighted 2), one en->fr: the shard's
    directions are the corpora's pair ranges, and the shares follow data.temperature."""
    from conftest import read_lines, write_lines

    en, de = read_lines("val.en.gz", 60), read_lines("val.de.gz", 60)
    first = tiny_config.data.train[0]
    files = [
        write_lines(tmp_path / name, lines)
        for name, lines in (
            ("a.en", en[:20]),
            ("a.de", de[:20]),
            ("b.en", en[20:]),
            ("b.fr", de[20:]),
        )
    ]
    data = dataclasses.replace(
        tiny_config.data,
        temperature=2.0,
        train=(
            first,
            CorpusConfig(src=str(files[0]), tgt=str(files[1]), weight=2),
            CorpusConfig(src=str(files[2]), tgt=str(files[3]), tgt_lang="fr"),
        ),
    )
    cfg = dataclasses.replace(tiny_config, data=data)
    build_tokenizer(cfg)
    manifest = preprocess(cfg)["train"]
    a, b, c = manifest["corpora"]
    assert [r["direction"] for r in (a, b, c)] == ["en-de", "en-de", "en-fr"]
    de_pairs, fr_pairs = a["written"] + b["written"], c["written"]
    assert (b["written"], fr_pairs) == (40, 40)
    total = de_pairs**0.5 + fr_pairs**0.5  # temperature 2: pairs ** (1/2)
    assert manifest["directions"] == {
        "en-de": {"pairs": de_pairs, "share": round(de_pairs**0.5 / total, 6)},
        "en-fr": {"pairs": 40, "share": round(40**0.5 / total, 6)},
    }
    shard = ShardDataset(cfg.run_path / "data" / "train")
    groups = shard.directions()
    assert list(groups) == ["en-de", "en-fr"]
    assert groups["en-fr"].tolist() == list(range(de_pairs, de_pairs + 40))
    src_vocab = load_vocabs(cfg.run_path, joint=True)[0]
    assert src_vocab.decode(shard[de_pairs][0].tolist()).startswith("<2fr> ")
    assert src_vocab.decode(shard[0][0].tolist()).startswith("<2de> ")

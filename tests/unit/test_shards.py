from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mtkit.config import DataConfig
from mtkit.data.shards import ShardDataset, length_filter, preprocess
from mtkit.data.sources import DataError
from mtkit.tokenizer import build_tokenizer, load_vocabs


def test_length_filter_reports_each_reason():
    src = [[5] * 3, [5] * 30, [5] * 4, [5] * 2]
    tgt = [[6] * 3, [6] * 3, [6] * 20, [6] * 2]
    keep, report = length_filter(src, tgt, DataConfig(max_len=10, max_len_ratio=2.0))
    assert keep.tolist() == [True, False, False, True]
    assert report == {"length": 2, "ratio": 0}
    keep, report = length_filter(src, tgt, DataConfig(max_len=100, max_len_ratio=2.0))
    assert keep.tolist() == [True, False, False, True] and report == {"length": 0, "ratio": 2}


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
        tiny_config.data, test=dataclasses.replace(tiny_config.data.test, tgt=str(bad)))
    cfg = dataclasses.replace(tiny_config, data=data)
    with pytest.raises(DataError, match=r"data.test: no pairs left after cleaning"):
        preprocess(cfg)
    assert not (cfg.run_path / "data").exists()
    assert not [p for p in cfg.run_path.iterdir() if p.name.startswith(".data")]


def test_unfinished_shard_folder_is_not_taken_for_data(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match=r"no finished shard here; run `mtkit preprocess`"):
        ShardDataset(tmp_path / "train")

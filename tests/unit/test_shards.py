"""The shard format: the streaming writer and the memory-mapped reader."""

from __future__ import annotations

import numpy as np
import pytest

from mtkit.data.batching import TokenBatchSampler, collate
from mtkit.data.shards import Encoded, ShardDataset, ShardWriter
from mtkit.data.sources import DataError


def test_unfinished_shard_folder_is_not_taken_for_data(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match=r"no finished shard here; run `mtkit preprocess`"):
        ShardDataset(tmp_path / "train")


def test_ids_past_65536_pieces_are_stored_as_uint32(tmp_path):
    writer = ShardWriter(tmp_path / "big", vocab_size=70_000, texts=False)
    lengths = np.array([3, 1], dtype=np.int32)
    ids = np.array([69_999, 65_536, 4, 12], dtype=np.uint32)
    chunk = Encoded(0, lengths, lengths, ids, ids[::-1].copy(), None, None)
    writer.append(chunk, np.array([True, True]))
    manifest = writer.finish({})
    shard = ShardDataset(tmp_path / "big")
    assert manifest["dtype"] == "uint32" and shard[0][0].tolist() == [69_999, 65_536, 4]
    batch = collate([shard[0], shard[1]])
    assert batch.src[0, :3].tolist() == [69_999, 65_536, 4] and batch.tgt_in[0, 3] == 65_536
    assert ShardWriter(tmp_path / "small", vocab_size=65_536, texts=False).dtype == np.uint16


def test_the_sampler_on_a_memory_mapped_shard_of_100k_pairs(tmp_path):
    rng = np.random.default_rng(0)
    n = 100_000
    writer = ShardWriter(tmp_path / "t", vocab_size=1000, texts=False)
    for start in range(0, n, 30_000):
        m = min(30_000, n - start)
        s_len = rng.integers(1, 60, m).astype(np.int32)
        t_len = rng.integers(1, 60, m).astype(np.int32)
        chunk = Encoded(
            0,
            s_len,
            t_len,
            rng.integers(4, 1000, s_len.sum()).astype(np.uint16),
            rng.integers(4, 1000, t_len.sum()).astype(np.uint16),
            None,
            None,
        )
        writer.append(chunk, np.ones(m, dtype=bool))
    writer.finish({})
    data = ShardDataset(tmp_path / "t")
    assert len(data) == n and data.src_lengths.dtype == data.tgt_lengths.dtype == np.int32
    assert "_maps" in data.__getstate__() and data.__getstate__()["_maps"] is None
    sampler = TokenBatchSampler(data.src_lengths, data.tgt_lengths, 4096, seed=3)
    batches = list(sampler)
    seen = np.concatenate([np.asarray(b) for b in batches])
    assert len(seen) == n and len(np.unique(seen)) == n  # every pair once
    for b in batches[:50]:
        cost = len(b) * max(data.src_lengths[b].max(), data.tgt_lengths[b].max()) + len(b)
        assert cost <= 4096 or len(b) == 1
    sampler.set_epoch(0, start_batch=17)  # exact resume mid-epoch
    assert list(sampler) == batches[17:]
    x, y = data[int(batches[5][0])]
    assert len(x) == data.src_lengths[batches[5][0]] and isinstance(x, np.ndarray)


def test_id_counts_count_one_side_of_the_pairs_asked_for(tmp_path, monkeypatch):
    """Pairs 0, 1 and 3 (two runs of consecutive pairs), each run read in slices: the
    counts of their ids on the side asked for, nothing of pair 2 or of the other side."""
    import mtkit.data.shards as shards

    monkeypatch.setattr(shards, "COUNT_SLICE", 2)  # slices that cut pairs apart
    writer = ShardWriter(tmp_path / "s", vocab_size=10, texts=False)
    src_lengths, tgt_lengths = np.array([2, 3, 1, 2], np.int32), np.array([1, 1, 1, 1], np.int32)
    src = np.array([4, 5, 5, 6, 7, 9, 8, 4], np.uint16)  # pairs: [4 5] [5 6 7] [9] [8 4]
    tgt = np.array([7, 7, 7, 7], np.uint16)
    writer.append(
        Encoded(0, src_lengths, tgt_lengths, src, tgt, None, None), np.ones(4, dtype=bool)
    )
    writer.finish({})
    data = ShardDataset(tmp_path / "s")
    counts = data.id_counts("src", np.array([0, 1, 3]), 10)
    assert counts.tolist() == [0, 0, 0, 0, 2, 2, 1, 1, 1, 0]
    assert data.id_counts("tgt", np.array([0, 1, 3]), 10)[7] == 3
    assert data.id_counts("src", np.array([2]), 10)[9] == 1

"""Guided alignment (`train.guided_alignment`, `mtkit.data.alignments`): the training
pairs aligned by eflomal at preprocess time, stored beside their shard, a batch's
alignment matrix, one cross-attention head trained on it, and translation reading its
word links from that head."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from mtkit.core.config import config_from_dict
from mtkit.data.alignments import AlignedShards, align_shard, aligned, grow_diag
from mtkit.data.batching import collate
from mtkit.data.shards import ShardDataset
from mtkit.data.sources import DataError
from mtkit.model.transformer import guided_attention

from conftest import tiny_config_dict

pytest.importorskip("eflomal")


def test_grow_diag_keeps_agreed_links_and_grows_to_unlinked_neighbours():
    forward = {(0, 0), (1, 1), (5, 5)}
    backward = {(0, 0), (1, 1), (1, 2), (2, 3), (0, 1)}
    # (1, 2) is next to (1, 1) with target 2 unlinked: grown, and then (2, 3) next to it;
    # (0, 1) links a source and a target already linked; (5, 5) is next to no kept link
    assert grow_diag(forward, backward) == {(0, 0), (1, 1), (1, 2), (2, 3)}


def test_a_batch_carries_each_target_positions_share_of_the_source():
    x, y = np.array([5, 6, 7]), np.array([8, 9])
    links = np.array([[0, 0], [2, 0], [1, 1]], dtype=np.int16)  # (source, target)
    batch = collate([(x, y, links), (x[:1], y[:1], np.zeros((0, 2), np.int16))])
    assert batch.align.shape == (2, 3, 4)  # (B, T: y + eos, S: x + eos)
    assert batch.align[0, 0].tolist() == [0.5, 0.0, 0.5, 0.0]
    assert batch.align[0, 1].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert batch.align[0, 2].sum() == 0 and batch.align[1].sum() == 0  # eos; no links


@pytest.fixture(scope="module")
def guided_run(corpus, tmp_path_factory):
    from mtkit.stages.preprocess import preprocess
    from mtkit.stages.tokenizer import build_tokenizer

    run = tmp_path_factory.mktemp("guided") / "run"
    cfg = config_from_dict(
        tiny_config_dict(corpus, run, train={"guided_alignment": 1.0, "max_steps": 60})
    )
    build_tokenizer(cfg)
    preprocess(cfg)
    return cfg


def test_preprocess_aligns_the_training_pairs_beside_their_shard(guided_run):
    folder = guided_run.run_path / "data" / "train"
    assert aligned(folder)
    data = AlignedShards(ShardDataset(folder))
    x, y, links = data[0]
    assert len(links) and (links[:, 0] < len(x)).all() and (links[:, 1] < len(y)).all()
    # most pairs get links, and the same ids tend to link to each other (a joint
    # vocabulary: names, numbers and punctuation are the same pieces on both sides)
    same = total = 0
    for i in range(200):
        x, y, links = data[i]
        total += len(links)
        same += sum(int(x[s] == y[t]) for s, t in links)
    assert total > 200 * 3 and same > 0


def test_alignments_of_other_pairs_are_refused_in_one_line(guided_run, tmp_path):
    folder = tmp_path / "train"
    shutil.copytree(guided_run.run_path / "data" / "train", folder)
    manifest = folder / "align" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"shard": "', '"shard": "0'))
    assert not aligned(folder)
    with pytest.raises(DataError, match="alignments are of other pairs") as e:
        AlignedShards(ShardDataset(folder))
    assert "\n" not in str(e.value)
    shutil.rmtree(folder / "align")
    with pytest.raises(DataError, match="no alignments of the training pairs"):
        AlignedShards(ShardDataset(folder))
    align_shard(folder)
    assert aligned(folder)


def _mass_on_links(run, data) -> float:
    """The guided layer's head 0 attention on the linked source positions of 64 training
    pairs (weighted as the links share a target position), after training `run`."""
    from mtkit.engines.loader import load_engine

    model = load_engine(run / "checkpoints" / "last.pt", "cpu").models[0]
    batch = collate([data[i] for i in range(64)])
    attention = guided_attention(model)
    model.train()
    attention.guided_head = 0
    with torch.no_grad():
        model(batch.src, batch.tgt_in)
    rows = batch.align.sum(-1) > 0  # (B, T): target positions with links
    return float((attention.guided * batch.align).sum(-1)[rows].mean())


def test_the_guided_head_learns_the_alignment_and_translation_reads_it(guided_run, tmp_path):
    from dataclasses import replace

    from mtkit.core.search_options import SearchOptions
    from mtkit.engines.loader import load_engine
    from mtkit.training.loop import train

    shutil.copytree(guided_run.run_path, tmp_path / "plain")
    plain = replace(
        guided_run,
        run_dir=str(tmp_path / "plain"),
        train=replace(guided_run.train, guided_alignment=0.0),
    )
    train(guided_run)
    train(plain)
    data = AlignedShards(ShardDataset(guided_run.run_path / "data" / "train"))
    guided, unguided = (
        _mass_on_links(guided_run.run_path, data),
        _mass_on_links(plain.run_path, data),
    )
    assert guided > 1.5 * unguided
    engine = load_engine(guided_run.run_path / "checkpoints" / "last.pt", "cpu")
    (hyps,) = engine.translate(["A dog runs."], SearchOptions(beam=2, alignments=True))
    assert hyps[0].alignment is not None

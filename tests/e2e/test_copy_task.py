"""The toy copy task (configs/copy.yaml), shrunk to train in seconds: the trained model
must copy held-out sequences, with greedy search and with beam 4."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtkit.config import load_config
from mtkit.data.shards import ShardDataset, preprocess
from mtkit.tokenizer import build_tokenizer
from mtkit.train import train
from mtkit.translate import DecodeOptions, load_translator, translate_texts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("copy") / "run"
    overrides = [f"run_dir={run}", "train.max_tokens=1024", "train.lr=0.003",
                 "train.max_steps=1000", "train.valid_every=1000", "train.log_every=1000"]
    data = ROOT / "data" / "copy"
    overrides += [f"data.{split}.{side}={data}/{name}.{side}.gz" for split, name in
                  (("train", "train"), ("valid", "valid"), ("test", "test"))
                  for side in ("src", "tgt")]
    cfg = load_config(ROOT / "configs" / "copy.yaml", overrides)
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    test = ShardDataset(run / "data" / "test")
    return load_translator(run / "checkpoints" / "last.pt", "cpu"), test.texts("src")


@pytest.mark.parametrize("beam", [1, 4])
def test_trained_copy_model_copies_held_out_sequences(copy_run, beam):
    translator, sources = copy_run
    short = [s for s in sources if len(s.split()) <= 12][:100]
    outputs = translate_texts(translator, short, DecodeOptions(beam=beam, max_len_a=1.0,
                                                               max_len_b=5))
    exact = sum(o == s for o, s in zip(outputs, short))
    assert exact == len(short), [(s, o) for s, o in zip(short, outputs) if s != o][:3]

"""Fine-tuning an imported Marian model (`tokenizer.from`, `train.init_from`,
`train.freeze`): the run uses the checkpoint's tokenizers and ids, starts from its
weights, lowers its validation loss on new data, resumes bit-identically after a kill,
and `mtkit run` scores it as any run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from hfmarian import marian_folder  # noqa: E402

from mtkit.core.checkpoint import load_checkpoint  # noqa: E402
from mtkit.core.config import config_from_dict  # noqa: E402
from mtkit.interop.marian_import import import_marian  # noqa: E402
from mtkit.stages.preprocess import preprocess  # noqa: E402
from mtkit.stages.tokenizer import TokenizerError, build_tokenizer  # noqa: E402
from mtkit.training.loop import train  # noqa: E402
from mtkit.training.state import TrainError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / "data" / "copy"


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("marian")
    return import_marian(marian_folder(folder / "model"), folder / "imported.pt")


def config(imported: Path, run: Path, **train) -> dict:
    """Fine-tune the imported model on the copy task (sequences of letters)."""
    data = {
        split: {"src": str(COPY / f"{name}.src.gz"), "tgt": str(COPY / f"{name}.tgt.gz")}
        for split, name in (("train", "train"), ("valid", "valid"), ("test", "test"))
    }
    return {
        "run_dir": str(run),
        "data": {**data, "max_len": 100, "workers": 1},
        "tokenizer": {"from": str(imported), "joint": False},
        "model": {"dropout": 0.0},
        "train": {
            "init_from": str(imported),
            "max_tokens": 1024,
            "lr": 0.001,
            "warmup_steps": 10,
            "max_steps": 40,
            "valid_every": 20,
            "device": "cpu",
            "precision": "fp32",
            "attention": "sdpa",
            **train,
        },
        "decode": {"precision": "fp32"},
    }


def valid_losses(run: Path) -> list[float]:
    return [
        e["valid_loss"]
        for e in map(json.loads, (run / "metrics.jsonl").open())
        if e.get("event") == "valid"
    ]


def test_fine_tuning_starts_from_the_import_and_lowers_the_validation_loss(imported, tmp_path):
    cfg = config_from_dict(config(imported, tmp_path / "run"))
    build_tokenizer(cfg)
    assert (tmp_path / "run" / "spm.tgt.pieces.json").is_file()
    preprocess(cfg)
    train(cfg)
    losses = valid_losses(tmp_path / "run")
    assert len(losses) == 2 and losses[1] < losses[0]
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    theirs = load_checkpoint(imported)
    assert saved["config"]["model"] == {**theirs["config"]["model"], "dropout": 0.0}
    assert saved["vocab"] == theirs["vocab"]  # the same tokenizers and id tables


def test_frozen_parts_keep_the_imported_weights(imported, tmp_path):
    cfg = config_from_dict(
        config(imported, tmp_path / "run", max_steps=5, valid_every=5, freeze="embeddings+encoder")
    )
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    after = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    before = load_checkpoint(imported)["model"]
    frozen = [k for k in before if k.startswith(("src_embed", "tgt_embed", "encoder_layers"))]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert not torch.equal(
        before["decoder_layers.0.ffn.inner.weight"], after["decoder_layers.0.ffn.inner.weight"]
    )


def test_a_killed_fine_tuning_resumes_to_the_same_weights(imported, tmp_path):
    straight = config_from_dict(config(imported, tmp_path / "a", max_steps=30, valid_every=10))
    build_tokenizer(straight)
    preprocess(straight)
    train(straight)
    data = config(imported, tmp_path / "b", max_steps=30, valid_every=10)
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(data))
    killed = config_from_dict(data)
    build_tokenizer(killed)
    preprocess(killed)
    command = [sys.executable, "-m", "mtkit", "train", "-c", str(path)]
    proc = subprocess.Popen(command, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 120
    while not (tmp_path / "b" / "checkpoints" / "step_10.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "training ended too early"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "resuming from" in done.stderr, done.stderr
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_mismatched_tokenizers_are_refused_in_one_line(imported, tmp_path):
    joint = config_from_dict(
        {**config(imported, tmp_path / "r"), "tokenizer": {"from": str(imported), "joint": True}}
    )
    with pytest.raises(TokenizerError, match="set tokenizer.joint: false"):
        build_tokenizer(joint)
    own = config(imported, tmp_path / "own")
    own["tokenizer"] = {"vocab_size": 40, "joint": True}
    cfg = config_from_dict(own)
    build_tokenizer(cfg)
    preprocess(cfg)
    with pytest.raises(TrainError, match="has other tokenizers than the run's"):
        train(cfg)

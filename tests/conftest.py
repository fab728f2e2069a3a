"""Shared fixtures: small slices of the embedded Multi30k corpus, written to tmp dirs."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from mtkit.core.config import config_from_dict
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer
from mtkit.training.loop import train

DATA = Path(__file__).resolve().parents[1] / "data" / "multi30k"

# The suite runs in pytest-xdist workers (`-n auto --dist loadfile`, pyproject.toml): each
# test file in one worker, the files spread over the workers. The tiny models gain nearly
# nothing from a second thread, so each worker, and each process it starts, keeps to one,
# and two workers share two cores without crowding them.
# Measured choices are not kept between processes in tests (`mtkit.tuning.measured`): each
# test measures, as it expects, and none reads or writes the user's cache.
os.environ["MTKIT_CACHE_DIR"] = ""

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# The most workers `-n auto` starts: the suite's two longest files (the multilingual
# models, minutes each) bound its time beyond that, and each worker builds the session's
# fixtures again.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    cores = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")  # not on macOS
        else os.cpu_count() or 1
    )
    return max(1, min(MAX_WORKERS, cores))


def read_lines(name: str, n: int | None = None) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n else lines


def write_lines(path: Path, lines: list[str]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """2,000 training pairs, 100 valid and 100 test pairs of Multi30k en-de."""
    root = tmp_path_factory.mktemp("corpus")
    out = {}
    for split, name, n in (
        ("train", "train", 2000),
        ("valid", "val", 100),
        ("test", "test2016", 100),
    ):
        for lang in ("en", "de"):
            out[f"{split}.{lang}"] = write_lines(
                root / f"{split}.{lang}", read_lines(f"{name}.{lang}.gz", n)
            )
    return out


def tiny_config_dict(corpus: dict[str, Path], run_dir: Path, **sections) -> dict:
    """A config for a tiny model on the corpus slice; `sections` override whole keys."""
    data = {
        "run_dir": str(run_dir),
        "data": {
            "train": {"src": str(corpus["train.en"]), "tgt": str(corpus["train.de"])},
            "valid": {"src": str(corpus["valid.en"]), "tgt": str(corpus["valid.de"])},
            "test": {"src": str(corpus["test.en"]), "tgt": str(corpus["test.de"])},
            "workers": 1,
        },
        "tokenizer": {"vocab_size": 500},
        "model": {
            "encoder_layers": 1,
            "decoder_layers": 1,
            "d_model": 16,
            "heads": 2,
            "ffn_dim": 32,
            "dropout": 0.0,
        },
        "train": {
            "max_tokens": 512,
            "warmup_steps": 10,
            "lr": 0.005,
            "max_steps": 20,
            "valid_every": 10,
            "device": "cpu",
            "precision": "fp32",
            # measured under auto: tests pin them
            "attention": "sdpa",
            "batch_shapes": "exact",
        },
        "decode": {"precision": "fp32"},  # translation's too
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    """A run directory with tokenizer and shards for `tiny_config_dict`, made once per
    test module; each test copies it."""
    run = tmp_path_factory.mktemp("prepared") / "run"
    cfg = config_from_dict(tiny_config_dict(corpus, run))
    build_tokenizer(cfg)
    preprocess(cfg)
    return run


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs (needs root and mount rights; skipped elsewhere)."""
    mounted = []

    def mount(size: str, readonly: bool = False):
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if readonly else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def tiny_config(corpus, tmp_path):
    return config_from_dict(tiny_config_dict(corpus, tmp_path / "run"))


SCORE_TOLERANCE = {"rel": 1e-5, "abs": 1e-6}


def assert_same_hypotheses(got, expected) -> None:
    """Hypotheses of one search run in different batch compositions (a stream vs alone,
    batched vs one by one): tokens and alignments exactly, log-probabilities and scores
    within `SCORE_TOLERANCE`. On AVX-512 kernels the order of a float sum depends on the
    batch's shape, so the last bits of a score differ between compositions.
    `got` and `expected` are equally nested lists of `Hypothesis`."""
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected):
            assert_same_hypotheses(g, e)
        return
    assert (got.tokens, got.alignment) == (expected.tokens, expected.alignment)
    assert got.log_prob == pytest.approx(expected.log_prob, **SCORE_TOLERANCE)
    assert got.score == pytest.approx(expected.score, **SCORE_TOLERANCE)


def write_config(folder: Path, corpus, **sections) -> Path:
    """`folder/exp.yaml` for a tiny model whose run directory is `folder/run`."""
    path = folder / "exp.yaml"
    data = tiny_config_dict(corpus, folder / "run", **sections)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def trained(corpus, tmp_path_factory) -> Path:
    """A folder with exp.yaml and run/: tokenizer, shards and 20 steps of training
    (checkpoints at steps 10 and 20). Tests copy it with the `work` fixture."""
    folder = tmp_path_factory.mktemp("trained")
    config = write_config(folder, corpus)
    cfg = config_from_dict(yaml.safe_load(config.read_text()))
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    return folder


@pytest.fixture
def work(trained, tmp_path, corpus) -> Path:
    """A private copy of the trained run in tmp_path (config rewritten to point at it)."""
    shutil.copytree(trained / "run", tmp_path / "run")
    write_config(tmp_path, corpus)
    return tmp_path


@pytest.fixture(scope="session")
def exported(trained, tmp_path_factory) -> Path:
    """A CTranslate2 export of the trained run's best.pt (tests copy it before damaging
    it); skipped without the `ct2` extra."""
    pytest.importorskip("ctranslate2")
    from mtkit.interop.ct2_export import export_ctranslate2

    folder = tmp_path_factory.mktemp("export") / "ct2"
    export_ctranslate2(trained / "run" / "checkpoints" / "best.pt", folder)
    return folder


@pytest.fixture(scope="session")
def tiny_engine():
    """A PyTorch engine with a random 1-layer model (d_model 16, 24 positions) and a
    120-piece vocabulary: fast, deterministic, not a translator."""
    import torch

    from mtkit.core.config import Config, ModelConfig, TokenizerConfig
    from mtkit.core.vocab import Vocab
    from mtkit.engines.pytorch import TorchEngine
    from mtkit.model.transformer import build_model
    from mtkit.stages.tokenizer import train_sentencepiece

    vocab = Vocab(
        train_sentencepiece(read_lines("train.en.gz", 300), TokenizerConfig(vocab_size=120))
    )
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=1,
        decoder_layers=1,
        d_model=16,
        heads=2,
        ffn_dim=32,
        dropout=0.0,
        max_positions=24,
    )
    model = build_model(cfg, len(vocab), len(vocab)).eval()
    return TorchEngine([model], vocab, vocab, torch.device("cpu"), None, Config(model=cfg))


def inference_mode_watched(engine):
    """A copy of the PyTorch `engine` whose model records, at each decoding step,
    whether inference mode is on: (the copy, the list of what each step saw)."""
    import torch

    seen: list[bool] = []
    model = engine.step_model

    class Watched:
        def __getattr__(self, name):
            return getattr(model, name)

        def decode_step(self, *args, **kwargs):
            seen.append(torch.is_inference_mode_enabled())
            return model.decode_step(*args, **kwargs)

    class WatchedEngine(type(engine)):
        step_model = Watched()

    return WatchedEngine(
        engine.models, engine.src_vocab, engine.tgt_vocab, engine.device, None, engine.config
    ), seen


def cli(*args, input: str | None = None):
    """Run the `mtkit` command line in-process (Typer's CliRunner); args may be paths."""
    from typer.testing import CliRunner

    from mtkit.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def one_line_error(result, says: str) -> None:
    """What every refused command gives: exit 2, one line on stderr that says `says`,
    no traceback, and nothing on stdout."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.output, lines
    assert result.stdout == ""

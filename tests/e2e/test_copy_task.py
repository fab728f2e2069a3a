"""The toy copy task (configs/copy.yaml), shrunk to train in seconds: the trained model
must copy held-out sequences, with greedy search and with beam 4."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtkit.core.config import load_config
from mtkit.core.search_options import SearchOptions
from mtkit.data.shards import ShardDataset
from mtkit.engines.loader import load_engine
from mtkit.engines.session import Session
from mtkit.model import int8
from mtkit.stages.preprocess import preprocess
from mtkit.stages.tokenizer import build_tokenizer
from mtkit.training.loop import train

from conftest import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def copy_checkpoint(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("copy") / "run"
    # fp32 on every machine: `precision: auto` would pick bf16 where the CPU has it, and
    # what this test checks (exact copies) must not depend on the CPU. 2,000 steps at lr
    # 0.003 after 200 of warm-up: with 0.002 after 100, 98 of the 100 lines came out exact
    # under ATEN_CPU_CAPABILITY=default; now 100 with seeds 1-3 under default and AVX-512
    # kernels and seed 1 under avx2 (and 293-300 of all 300 test lines).
    overrides = [
        f"run_dir={run}",
        "train.max_tokens=1024",
        "train.lr=0.003",
        "train.warmup_steps=200",
        "train.max_steps=2000",
        "train.valid_every=2000",
        "train.log_every=2000",
        "train.precision=fp32",
    ]
    data = ROOT / "data" / "copy"
    overrides += [
        f"data.{split}.{side}={data}/{name}.{side}.gz"
        for split, name in (("train", "train"), ("valid", "valid"), ("test", "test"))
        for side in ("src", "tgt")
    ]
    cfg = load_config(ROOT / "configs" / "copy.yaml", overrides)
    build_tokenizer(cfg)
    preprocess(cfg)
    train(cfg)
    return run / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def copy_run(copy_checkpoint):
    test = ShardDataset(copy_checkpoint.parents[1] / "data" / "test")
    # Translated in fp32 too: in bf16 (where `auto` takes it) a line in a hundred may
    # come out with a token more or less.
    return load_engine(copy_checkpoint, "cpu", precision="fp32"), test.texts("src")


@pytest.mark.parametrize("beam", [1, 4])
def test_trained_copy_model_copies_held_out_sequences(copy_run, beam):
    translator, sources = copy_run
    short = [s for s in sources if len(s.split()) <= 12][:100]
    outputs = [
        t.text
        for t in Session(
            translator, SearchOptions(beam=beam, max_len_a=1.0, max_len_b=5)
        ).translate_texts(short)
    ]
    exact = sum(o == s for o, s in zip(outputs, short))
    # All but at most one. The model is trained in fp32, but each CPU's kernels sum in
    # their own order, so each trains its own model: on one CPU it made 'v e e' of 'v e'
    # at log-probability -0.001, greedy and beam 4: the model's own error, not a search's.
    assert exact >= len(short) - 1, [(s, o) for s, o in zip(short, outputs) if s != o][:3]


@pytest.mark.skipif(not int8.int8_supported(), reason="no int8 products in this torch")
def test_the_copy_model_copies_in_int8_too(copy_checkpoint, copy_run):
    _, sources = copy_run
    short = [s for s in sources if len(s.split()) <= 12][:100]
    result = cli(
        "translate",
        "-m",
        copy_checkpoint,
        "--precision",
        "int8",
        "--beam",
        "4",
        "--max-len-a",
        "1.0",
        "--max-len-b",
        "5",
        input="".join(s + "\n" for s in short),
    )
    assert result.exit_code == 0, result.output
    outputs = result.stdout.splitlines()
    assert len(outputs) == len(short)
    exact = sum(o == s for o, s in zip(outputs, short, strict=True))
    assert exact >= len(short) - 2, [(s, o) for s, o in zip(short, outputs) if s != o][:3]
    engine = load_engine(copy_checkpoint, "cpu", precision="int8")
    assert engine.describe()["precision"] == "int8"
    assert not any(isinstance(m, torch.nn.Linear) for m in engine.model.modules())


def test_the_copy_model_copies_with_bf16_weights_too(copy_checkpoint, copy_run):
    _, sources = copy_run
    short = [s for s in sources if len(s.split()) <= 12][:100]
    engine = load_engine(copy_checkpoint, "cpu", precision="bf16")
    assert engine.describe()["precision"] == "bf16" and engine.autocast_dtype is None
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    for beam in (1, 4):
        outputs = [
            t.text
            for t in Session(
                engine, SearchOptions(beam=beam, max_len_a=1.0, max_len_b=5)
            ).translate_texts(short)
        ]
        exact = sum(o == s for o, s in zip(outputs, short, strict=True))
        assert exact >= len(short) - 2, [(s, o) for s, o in zip(short, outputs) if s != o][:3]


def test_a_prefix_of_the_first_symbols_yields_the_full_copy(copy_run):
    translator, sources = copy_run
    short = [s for s in sources if 6 <= len(s.split()) <= 12][:40]
    firsts = [" ".join(s.split()[:3]) for s in short]
    for beam in (1, 4):
        hyps = translator.translate(
            short, SearchOptions(beam=beam, max_len_a=1.0, max_len_b=5), prefixes=firsts
        )
        outputs = [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]
        assert outputs == short
    # a prefix the model would not write itself is still where the output starts (as
    # pieces: what follows it is the model's choice, and may continue the same word)
    other = [next(c for c in "abcdefghij" if c != s.split()[0]) for s in short]
    hyps = translator.translate(short, SearchOptions(beam=4), prefixes=other)
    forced = translator.tgt_vocab.encode(other)
    assert all(len(f) >= 1 and list(h[0].tokens[: len(f)]) == f for h, f in zip(hyps, forced))


def test_the_copy_models_alignment_is_the_diagonal(copy_run):
    translator, sources = copy_run
    short = [s for s in sources if len(s.split()) <= 12][:60]

    def links(layer):
        opts = SearchOptions(beam=4, max_len_a=1.0, max_len_b=5, alignments=True, align_layer=layer)
        return [h[0].alignment for h in translator.translate(short, opts)]

    assert links(None) == links(1)  # default: the last of 2 layers
    second_to_last = links(0)
    words = [len(s.split()) for s in short]  # about a link per word:
    assert all(len(a) <= n for a, n in zip(second_to_last, words, strict=True))
    assert sum(map(len, second_to_last)) >= 0.99 * sum(words)
    # The diagonal, but for a link or two that the training's random draws decide (one
    # of 420 in one run: target word 1 linked to source word 0)
    flat = [link for sentence in second_to_last for link in sentence]
    assert sum(s == t for s, t in flat) / len(flat) > 0.99
    last = [link for sentence in links(1) for link in sentence]  # the last layer: mostly
    assert sum(s == t for s, t in last) / len(last) > 0.8


def test_constraints_of_input_symbols_are_met_and_outputs_stay_copies(copy_run):
    translator, sources = copy_run
    short = [s for s in sources if 6 <= len(s.split()) <= 12][:40]
    # one symbol, a two-symbol phrase, and an alternative whose other phrase is absent
    wanted = [
        [(s.split()[1],), (" ".join(s.split()[3:5]),), ("z z z", s.split()[-1])] for s in short
    ]
    # Beam 10: dynamic beam allocation needs a beam wider than the constraints' tokens
    # (here 8: this vocabulary writes each word-start marker as a piece of its own), or
    # hypotheses that met more of them early crowd out the exact copy
    hyps = translator.translate(
        short, SearchOptions(beam=10, max_len_a=1.0, max_len_b=5), constraints=wanted
    )
    outputs = [translator.tgt_vocab.decode(h[0].tokens) for h in hyps]
    assert outputs == short
    assert all(h[0].met for h in hyps)

from __future__ import annotations

import struct

import pytest
import torch

from mtkit.core.config import ModelConfig
from mtkit.core.vocab import PAD, Vocab
from mtkit.model.attention import watching
from mtkit.model.transformer import build_model, count_parameters
from mtkit.stages.explain import (
    attention_maps,
    format_parameter_table,
    format_trace,
    make_batch,
    parameter_table,
    plot_attention,
    trace_shapes,
)

CFG = ModelConfig(
    encoder_layers=1,
    decoder_layers=1,
    d_model=8,
    heads=2,
    ffn_dim=32,
    dropout=0.0,
    max_positions=32,
)
PAIRS = [("a b c", "x y z w v"), ("a b", "x y")]  # S = 4, T = 6 after eos / bos


def trace(**kw):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**vars(CFG), **kw}), 20, 20)
    return model, trace_shapes(model, make_batch(PAIRS, None, None, 20), values=True)


def test_shape_trace_lists_the_stages_in_data_flow_order():
    _, stages = trace()
    got = [(s.name, s.shape) for s in stages]
    expected = [
        ("source token ids", (2, 4)),
        ("source embeddings * sqrt(D) + positions, dropout", (2, 4, 8)),
        ("encoder layer 0 / self-attention / Q projection", (2, 4, 8)),
        ("encoder layer 0 / self-attention / queries split into heads", (2, 2, 4, 4)),
        ("encoder layer 0 / self-attention / scores QK^T / sqrt(d_k)", (2, 2, 4, 4)),
        ("encoder layer 0 / self-attention / padding mask", (2, 1, 4, 4)),
        ("encoder layer 0 / self-attention / attention weights softmax", (2, 2, 4, 4)),
        ("encoder layer 0 / self-attention / weighted values", (2, 2, 4, 4)),
        ("encoder layer 0 / self-attention / heads concatenated", (2, 4, 8)),
        ("encoder layer 0 / self-attention / output projection", (2, 4, 8)),
        ("encoder layer 0 / FFN in (D -> F), before the activation", (2, 4, 32)),
        ("encoder layer 0 / FFN out (F -> D)", (2, 4, 8)),
        ("target input ids (bos + y)", (2, 6)),
        ("decoder layer 0 / masked self-attention / scores QK^T / sqrt(d_k)", (2, 2, 6, 6)),
        ("decoder layer 0 / masked self-attention / causal mask", (6, 6)),
        ("decoder layer 0 / cross-attention / scores QK^T / sqrt(d_k)", (2, 2, 6, 4)),
        ("logits (tied output projection D -> V)", (2, 6, 20)),
        ("log-probabilities (log-softmax over V)", (2, 6, 20)),
        ("label-smoothed loss per token (eps 0.1)", ()),
    ]
    positions = [got.index(item) for item in expected]  # raises if a stage is missing
    assert positions == sorted(positions)
    lookups = [s.axes for s in stages if s.name.startswith("token embedding lookup")]
    assert lookups == ["(B, S, D)", "(B, T, D)"]  # one shared embedding, seen twice
    text = format_trace(stages, CFG, 20, values=True)
    assert "(B, H, T, S)" in text and "V vocab=20" in text


def test_causal_mask_in_the_trace_is_lower_triangular_and_padding_is_masked():
    _, stages = trace()
    causal = next(s for s in stages if s.name.endswith("causal mask"))
    assert torch.equal(causal.values, torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    weights = next(
        s
        for s in stages
        if s.name == "encoder layer 0 / self-attention / attention weights softmax"
    ).values
    assert torch.all(weights[1, :, :, 3] == 0)  # second sentence: position 3 is padding
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 4))


def test_tracing_does_not_change_the_output():
    model, _ = trace()
    batch = make_batch(PAIRS, None, None, 20)
    plain = model.decode(batch.tgt_in, *model.encode(batch.src))
    seen = []
    with watching({model.decoder_layers[0].cross_attn: lambda name, t: seen.append(name)}):
        traced = model.decode(batch.tgt_in, *model.encode(batch.src))
    assert seen and torch.allclose(plain, traced, atol=1e-6)


@pytest.mark.parametrize(
    "kw", [{}, {"norm": "pre", "positions": "learned"}, {"share_embeddings": False}]
)
def test_parameter_table_matches_the_model(kw):
    model = build_model(
        ModelConfig(**{**vars(CFG), **kw}),
        20,
        20 if not kw else 24 if "share_embeddings" in kw else 20,
    )
    rows = parameter_table(model)
    assert sum(r.count for r in rows) == count_parameters(model)
    assert all(r.count == r.formula_value for r in rows), rows
    assert "4(D^2 + D)" in format_parameter_table(model)


def test_attention_pngs_are_written_and_valid(tmp_path):
    from mtkit.core.config import TokenizerConfig
    from mtkit.stages.tokenizer import train_sentencepiece

    from conftest import read_lines

    vocab = Vocab(
        train_sentencepiece(read_lines("train.en.gz", 300), TokenizerConfig(vocab_size=100))
    )
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**vars(CFG), "encoder_layers": 2}), 100, 100)
    maps = attention_maps(model, vocab, vocab, "A dog runs in the park.", 1.0, 2)
    assert len(maps.encoder) == 2 and len(maps.cross) == 1
    s, t = len(maps.src_tokens), len(maps.tgt_tokens)
    assert maps.cross[0].shape == (2, t, s) and maps.decoder[0].shape == (2, t, t)
    assert PAD not in maps.src_tokens
    paths = plot_attention(maps, tmp_path / "att")
    names = sorted(p.name for p in paths)
    assert names == [
        "alignment.png",
        "cross_layer0.png",
        "decoder_layer0.png",
        "encoder_layer0.png",
        "encoder_layer1.png",
    ]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100

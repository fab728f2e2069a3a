from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from scripted import batch, tiny

from mtkit.core.config import ModelConfig
from mtkit.core.vocab import PAD
from mtkit.model.cache import BeamCache
from mtkit.model.transformer import build_model, count_parameters, sinusoidal_positions

V = 40


def closed_form_count(cfg: ModelConfig, vocab: int) -> int:
    d, f = cfg.d_model, cfg.ffn_dim
    attention = 4 * (d * d + d)  # Q, K, V, output projections with biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder = cfg.encoder_layers * (attention + ffn + 2 * norm)
    decoder = cfg.decoder_layers * (2 * attention + ffn + 3 * norm)
    final_norms = 2 * norm if cfg.norm == "pre" else 0
    return vocab * d + encoder + decoder + final_norms  # one embedding, tied to the output


def test_base_model_parameter_count_matches_the_closed_form():
    base = ModelConfig()  # the paper's base: 6+6 layers, d 512, 8 heads, FFN 2048
    model = build_model(base, 37000, 37000)
    assert count_parameters(model) == closed_form_count(base, 37000) == 63_082_496
    pre = ModelConfig(norm="pre", encoder_layers=1, decoder_layers=1)
    assert count_parameters(build_model(pre, 100, 100)) == closed_form_count(pre, 100)


def test_separate_embeddings_when_not_shared():
    cfg = tiny(share_embeddings=False)
    model = build_model(cfg, 30, 50)
    shared = closed_form_count(cfg, 50)
    assert count_parameters(model) == shared + 30 * cfg.d_model
    assert model.output_weight is model.tgt_embed.tokens.weight


def forward(model, seed: int = 0):
    """A batch through the model: src, tgt, memory, src mask, logits."""
    src, tgt = batch(seed)
    memory, mask = model.encode(src)
    return src, tgt, memory, mask, model.decode(tgt, memory, mask)


@pytest.mark.parametrize("kw", [{}, {"norm": "pre"}, {"output_bias": True}])
def test_the_unprojected_forward_makes_the_same_logits(kw):
    model = build_model(tiny(**kw), V, V).eval()
    if model.output_bias is not None:
        model.output_bias.normal_()
    src, tgt = batch()
    hidden, weight, bias = model(src, tgt)
    assert hidden.shape == (3, 6, 16) and weight is model.output_weight
    assert bias is model.output_bias
    logits = model.decode(tgt, *model.encode(src))  # (B, T, V)
    assert torch.allclose(F.linear(hidden, weight, bias), logits, atol=1e-6)


def test_marians_positions_are_the_papers_sines_then_cosines():
    from mtkit.model.transformer import sinusoidal_positions, split_sinusoidal_positions

    paper, split = sinusoidal_positions(50, 16), split_sinusoidal_positions(50, 16)
    assert torch.equal(split[:, :8], paper[:, 0::2]) and torch.equal(split[:, 8:], paper[:, 1::2])
    assert split[7, 0] == pytest.approx(math.sin(7.0))
    assert split[7, 8] == pytest.approx(math.cos(7.0))


def test_padded_source_positions_receive_zero_attention():
    model = build_model(tiny(), V, V).eval()
    src, tgt, memory, mask, logits = forward(model)
    noisy = memory.clone()
    noisy[~mask] = torch.randn(int((~mask).sum()), 16) * 100  # garbage at pad positions
    assert torch.allclose(model.decode(tgt, noisy, mask), logits, atol=1e-6)
    # Encoder: extra padding changes nothing at real positions.
    longer = torch.cat([src, torch.full((3, 5), PAD)], dim=1)
    memory2, _ = model.encode(longer)
    assert torch.allclose(memory2[:, :7][mask], memory[mask], atol=1e-5)


def test_decoder_is_causal():
    model = build_model(tiny(), V, V).eval()
    _, tgt, memory, mask, logits = forward(model)
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, V, (3, 3))
    other = model.decode(changed, memory, mask)
    assert torch.allclose(other[:, :3], logits[:, :3], atol=1e-6)
    assert not torch.allclose(other[:, 3:], logits[:, 3:])


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"norm": "pre"},
        {"positions": "learned"},
        {"activation": "gelu", "share_embeddings": False},
    ],
)
def test_decode_step_matches_full_decode(kw):
    torch.manual_seed(0)
    model = build_model(tiny(**kw), V, V).eval()
    _, tgt, memory, mask, full = forward(model, seed=1)  # full: (B, T, V)
    state = None
    for t in range(tgt.size(1)):
        step_logits, state = model.decode_step(tgt[:, t], memory, mask, state)
        assert torch.allclose(step_logits, full[:, t], atol=1e-5), t
    assert isinstance(state, BeamCache) and state.length == tgt.size(1)


@pytest.mark.parametrize("kw", [{}, {"norm": "pre"}])
def test_rows_of_a_sentence_share_its_source_once(kw):
    """W rows per sentence against one memory row each give what W copies of the memory
    give: a beam search holds the source once per sentence."""
    torch.manual_seed(0)
    model = build_model(tiny(**kw), V, V).eval()
    src, tgt = batch()  # 3 sentences
    memory, mask = model.encode(src)
    width = 2
    rows = torch.arange(3).repeat_interleave(width)  # (6,): sentence of each row
    shared = copied = None
    for t in range(tgt.size(1)):
        token = tgt[rows, 0] if t == 0 else torch.randint(4, V, (6,))  # beams differ
        a, shared = model.decode_step(token, memory, mask, shared)
        b, copied = model.decode_step(token, memory[rows], mask[rows], copied)
        assert a.shape == (6, V) and torch.allclose(a, b, atol=1e-5), t
    assert shared.cross_k[0].size(0) == 3 and copied.cross_k[0].size(0) == 6


def test_sinusoidal_table_follows_the_paper():
    table = sinusoidal_positions(10, 8)
    assert table.shape == (10, 8)
    assert table[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0)).item())
    assert table[3, 1].item() == pytest.approx(torch.cos(torch.tensor(3.0)).item())
    assert table[5, 2].item() == pytest.approx(torch.sin(torch.tensor(5 / 10000 ** (2 / 8))).item())


def test_embeddings_are_scaled_and_too_long_input_is_an_error():
    model = build_model(tiny(positions="learned"), V, V).eval()
    ids = torch.tensor([[5, 6]])
    with torch.no_grad():
        model.src_embed.learned.weight.zero_()
    expected = model.src_embed.tokens(ids) * 4.0  # sqrt(16)
    assert torch.allclose(model.src_embed(ids), expected)
    with pytest.raises(ValueError, match=r"exceeds model.max_positions=64"):
        model.encode(torch.full((1, 65), 5))


def test_gradients_reach_every_parameter():
    model = build_model(tiny(dropout=0.1), V, V)
    src, tgt = batch()
    model.decode(tgt, *model.encode(src)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing

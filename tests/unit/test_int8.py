"""Dynamic int8 products for translation (`mtkit.model.int8`): exact where the numbers are
int8 already, close to fp32 otherwise, stacked layers equal to separate ones, and a
quantized model whose every product is int8."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mtkit.core.config import ModelConfig
from mtkit.model import int8
from mtkit.model.attention import stacked_linear
from mtkit.model.int8 import Int8Linear
from mtkit.model.transformer import build_model

pytestmark = pytest.mark.skipif(not int8.int8_supported(), reason="no int8 products here")


def test_a_product_of_numbers_that_are_int8_already_is_exact():
    # in the weight range this CPU multiplies exactly (127, or 63 without VNNI)
    generator = torch.Generator().manual_seed(0)
    q = int8.weight_range()
    weight = torch.randint(-q, q + 1, (24, 40), generator=generator).float()
    weight[:, 0] = q  # each row's largest magnitude is q: its scale is exactly 1
    x = torch.randint(-127, 128, (5, 3, 40), generator=generator).float()
    x[..., 0] = -127
    bias = torch.randn(24, generator=generator)
    layer = Int8Linear(weight, bias)
    assert layer.weight_t.dtype == torch.int8 and layer.weight_t.shape == (40, 24)
    out = layer(x)  # (5, 3, 24)
    assert out.shape == (5, 3, 24) and out.dtype == torch.float32
    assert torch.equal(out, x @ weight.t() + bias)


def test_a_float_product_is_within_its_rounding():
    generator = torch.Generator().manual_seed(1)
    linear = nn.Linear(256, 64)
    x = torch.randn(50, 256, generator=generator)
    expected = linear(x)
    got = Int8Linear.of(linear)(x)
    # each factor is off by at most half a step (amax / 254) of its own row
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    assert (got - expected).abs().max() > 0  # rounded, so not the fp32 product


def test_stacked_int8_layers_give_what_each_gives():
    layers = [Int8Linear.of(nn.Linear(32, n)) for n in (16, 32, 8)]
    x = torch.randn(4, 6, 32)
    parts = stacked_linear(x, layers)
    assert [p.shape for p in parts] == [(4, 6, 16), (4, 6, 32), (4, 6, 8)]
    for part, layer in zip(parts, layers, strict=True):
        assert torch.equal(part, layer(x))


def test_a_quantized_model_has_no_float_linear_and_keeps_the_argmax():
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=2, d_model=64, heads=4, ffn_dim=128, dropout=0.0
    )
    model = build_model(cfg, 60, 60).eval()
    quantized = int8.quantize(copy.deepcopy(model))
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert isinstance(quantized.output_int8, Int8Linear)
    src = torch.randint(4, 60, (3, 9))  # (B, S)
    tgt = torch.randint(4, 60, (3, 7))  # (B, T)
    with torch.no_grad():
        expected = model.decode(tgt, *model.encode(src))  # (B, T, V)
        got = quantized.decode(tgt, *quantized.encode(src))
        # the step-by-step path (cross-attention keys/values stacked, a cache) agrees
        memory, mask = quantized.encode(src)
        step, _ = quantized.decode_step(tgt[:, 0], memory, mask)  # (B, V)
    assert got.shape == expected.shape == (3, 7, 60)
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.95
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
    assert torch.allclose(step, got[:, 0], atol=1e-5)
    assert quantized.output_weight.dtype == torch.float32  # the embedding stays float


def saturating_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What an int8 product without VNNI computes (oneDNN on AVX2): inputs shifted to
    unsigned bytes, products added in pairs in 16 bits, saturating, then in 32 bits,
    and the shift taken back out."""
    u = x.long() + 128  # (N, K) 0..255
    pairs = (u[:, :, None] * w.long()[None]).view(u.size(0), -1, 2, w.size(1)).sum(2)
    pairs = pairs.clamp(-32768, 32767)  # (N, K/2, M): vpmaddubsw
    return (pairs.sum(1) - 128 * w.long().sum(0)).int()  # (N, M)


def test_the_weight_range_is_reduced_where_full_range_products_saturate(monkeypatch):
    assert int8.products_exact(127, lambda x, w: x.long() @ w.long())
    assert not int8.products_exact(127, saturating_mm)  # 255 x 127 x 2 > 32,767
    assert int8.products_exact(63, saturating_mm)  # 255 x 63 x 2 fits
    # the choice follows the probe: weights rounded to -63..63 where it fails
    weight = torch.randn(16, 256)
    monkeypatch.setattr(int8, "weight_range", lambda: 63)
    assert Int8Linear(weight, None).weight_t.abs().max() == 63
    monkeypatch.setattr(int8, "weight_range", lambda: 127)
    assert Int8Linear(weight, None).weight_t.abs().max() == 127


def test_products_at_the_chosen_range_are_exact_on_this_cpu():
    # The real kernel: inputs at full range, weights at `weight_range()`. Without the
    # reduced range, 99% of such products were wrong under ONEDNN_MAX_CPU_ISA=AVX2.
    generator = torch.Generator().manual_seed(2)
    q = int8.weight_range()
    x = torch.randint(-127, 128, (64, 512), dtype=torch.int8, generator=generator)
    x[:4] = 127
    w = torch.randint(-q, q + 1, (512, 96), dtype=torch.int8, generator=generator)
    assert torch.equal(torch._int_mm(x, w).long(), x.long() @ w.long())
    assert int8.int8_supported() and int8.products_exact(q)

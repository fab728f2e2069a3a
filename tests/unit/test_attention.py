"""Attention and dropout (`mtkit.model.attention`): the stacked projections compute what the
separate Linear layers do, the CPU dropout masks drop what they say, and matmul + softmax
computes what SDPA does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtkit.core.config import ModelConfig
from mtkit.model.attention import (
    MultiHeadAttention,
    dropout,
    keep_mask,
    matmul_attention,
    stacked_linear,
    watching,
)
from mtkit.model.transformer import build_model


@pytest.mark.parametrize("p", [0.1, 0.5, 0.3])
def test_keep_mask_drops_p_of_the_elements_in_every_lane_of_a_draw(p):
    torch.manual_seed(0)
    keep, rounded = keep_mask(torch.Size([4096, 64]), p, torch.device("cpu"))
    assert keep.shape == (4096, 64) and keep.dtype == torch.bool
    assert rounded == round(p * 65536) / 65536 and abs(rounded - p) <= 1 / 131072
    # Four 16-bit lanes make each 64-bit draw; a lane with a biased bit (the top bit of
    # `random_()` without a range is always 0) would keep far more or fewer.
    lanes = keep.reshape(-1, 4).float().mean(dim=0)  # (4,)
    sd = (p * (1 - p) / (keep.numel() / 4)) ** 0.5
    assert torch.all((lanes - (1 - p)).abs() < 5 * sd), lanes


def test_dropout_scales_what_it_keeps_and_works_on_any_shape():
    x = torch.rand(3, 5, 7) + 1.0  # 105 elements: not a multiple of 4
    torch.manual_seed(1)
    out = dropout(x, 0.25)
    kept = out != 0
    assert 0 < int(kept.sum()) < 105
    torch.testing.assert_close(out[kept], x[kept] / 0.75)
    torch.manual_seed(1)
    assert torch.equal(dropout(x, 0.25), out)  # the global generator decides the mask
    assert dropout(x, 0.0) is x


def test_dropout_keeps_the_mean_of_a_large_tensor():
    torch.manual_seed(2)
    x = torch.ones(512, 512, dtype=torch.bfloat16)
    out = dropout(x, 0.1)
    assert out.dtype == torch.bfloat16
    assert abs(float(out.float().mean()) - 1.0) < 0.01
    assert abs(float((out == 0).float().mean()) - 0.1) < 0.005


def test_stacked_linear_is_each_layer_applied_alone():
    torch.manual_seed(3)
    layers = [nn.Linear(16, 8), nn.Linear(16, 24), nn.Linear(16, 8)]
    x = torch.randn(2, 5, 16)
    outs = stacked_linear(x, layers)
    assert [o.shape for o in outs] == [(2, 5, 8), (2, 5, 24), (2, 5, 8)]
    for layer, out in zip(layers, outs, strict=True):
        torch.testing.assert_close(out, layer(x))
    sum(o.sum() for o in outs).backward()  # gradients reach each layer's own weights
    assert all(layer.weight.grad is not None for layer in layers)


def test_a_translation_engines_stack_is_kept_until_a_weight_changes():
    """Layers marked final (`keep_stacked_weights`, as the engine does) stack their
    weights once without gradients: the same stack while nothing changes; a new one
    after a weight is written in place, replaced, given new memory or cast (bf16, int8),
    and each time the layers' own outputs. Unmarked layers, and marked ones with
    gradients on (training), keep none; inference-mode weights work; never a state-dict
    entry."""
    from mtkit.model.attention import keep_stacked_weights
    from mtkit.model.int8 import Int8Linear

    torch.manual_seed(5)
    layers = [nn.Linear(16, 8), nn.Linear(16, 8)]
    x = torch.randn(3, 16)

    def check(atol=1e-6):
        with torch.no_grad():
            xx = x.to(layers[0].weight.dtype) if isinstance(layers[0], nn.Linear) else x
            outs = stacked_linear(xx, layers)
            for layer, out in zip(layers, outs, strict=True):
                torch.testing.assert_close(out, layer(xx), atol=atol, rtol=0)
        return getattr(layers[0], "_stacked", (None,) * 3)[2]

    assert check() is None  # not marked: stacked anew at each call
    stacked_linear(x, layers)  # gradients on
    assert not hasattr(layers[0], "_stacked")
    keep_stacked_weights(nn.ModuleList(layers))
    stacked_linear(x, layers)[0].sum().backward()  # training: still none kept
    assert not hasattr(layers[0], "_stacked")
    first = check()
    assert first is not None and check() is first  # kept
    with torch.no_grad():
        layers[1].weight.mul_(2)  # written in place (an optimizer step)
    second = check()
    assert second is not first
    layers[0].bias = nn.Parameter(torch.randn(8))  # replaced
    layers[0].keep_stacked = True
    third = check()
    assert third is not second and check() is third
    layers[1].weight.data = layers[1].weight.data * 3  # new memory in the same Parameter
    assert check() is not third
    layers = keep_stacked_weights(nn.ModuleList(la.to(torch.bfloat16) for la in layers))
    check(atol=0.05)  # cast
    layers = keep_stacked_weights(nn.ModuleList(Int8Linear.of(la.float()) for la in layers))
    check(atol=0.05)  # int8
    assert not any("stacked" in name for name in layers.state_dict())
    with torch.inference_mode():  # weights made in inference mode have no version
        layers = keep_stacked_weights(nn.ModuleList([nn.Linear(16, 8), nn.Linear(16, 8)]))
        check()


def test_self_attention_projects_queries_keys_and_values_as_its_three_layers():
    torch.manual_seed(4)
    attn = MultiHeadAttention(32, 4, 0.0)
    x = torch.randn(3, 6, 32)
    q, k, v = attn.project_qkv(x)
    torch.testing.assert_close(q, attn.split_heads(attn.q_proj(x)))
    torch.testing.assert_close(k, attn.split_heads(attn.k_proj(x)))
    torch.testing.assert_close(v, attn.split_heads(attn.v_proj(x)))
    torch.testing.assert_close(attn.project_q(x), q)
    seen = []  # watched (an observer, as `mtkit explain`), the Linear layers themselves run
    attn.q_proj.register_forward_hook(lambda m, i, o: seen.append("q"))
    with watching({attn: lambda stage, t: None}):
        attn.project_qkv(x)
    assert seen == ["q"]


def test_cross_kv_in_one_product_equals_each_layers_own():
    torch.manual_seed(5)
    model = build_model(
        ModelConfig(encoder_layers=1, decoder_layers=3, d_model=32, heads=4, ffn_dim=64), 20, 20
    ).eval()
    memory = torch.randn(2, 7, 32)
    keys, values = model.cross_kv(memory)
    for layer, k, v in zip(model.decoder_layers, keys, values, strict=True):
        want_k, want_v = layer.cross_attn.project_kv(memory)
        torch.testing.assert_close(k, want_k)
        torch.testing.assert_close(v, want_v)


def test_cross_kv_stacks_on_a_cpu_or_without_gradients_only(monkeypatch):
    """On a GPU in training, one product would hold every layer's key/value gradients
    until the backward pass reaches the first layer: there each layer makes its own."""
    import mtkit.model.transformer

    calls = []
    real = mtkit.model.transformer.stacked_linear
    monkeypatch.setattr(
        mtkit.model.transformer,
        "stacked_linear",
        lambda x, layers: calls.append(x.device.type) or real(x, layers),
    )
    model = build_model(
        ModelConfig(encoder_layers=1, decoder_layers=2, d_model=32, heads=4, ffn_dim=64), 20, 20
    )
    model.cross_kv(torch.randn(2, 7, 32))  # CPU, with gradients: stacked
    assert calls == ["cpu"]
    gpu_like = model.to("meta")  # a device other than the CPU
    keys, _ = gpu_like.cross_kv(torch.randn(2, 7, 32, device="meta"))
    assert calls == ["cpu"] and keys[0].shape == (2, 4, 7, 8)  # layer by layer
    with torch.no_grad():
        gpu_like.cross_kv(torch.randn(2, 7, 32, device="meta"))
    assert calls == ["cpu", "meta"]


@pytest.mark.parametrize("causal, masked", [(False, True), (True, False), (True, True)])
def test_matmul_attention_computes_what_sdpa_computes(causal, masked):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8) for _ in range(3))
    mask = (torch.arange(7)[None, :] < torch.tensor([7, 5, 3])[:, None])[:, None, None, :]
    mask = mask if masked else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    got = matmul_attention(q, k, v, mask, causal)
    assert torch.allclose(got, expected, atol=1e-6)


def test_a_model_translates_the_same_with_either_kernel():
    torch.manual_seed(0)
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0
    )
    model = build_model(cfg, 50, 50).eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = torch.tensor([[2, 10, 11], [2, 12, 0]])
    with torch.no_grad():
        sdpa = model.decode(tgt, *model.encode(src))
        model.use_attention("matmul")
        matmul = model.decode(tgt, *model.encode(src))
    assert torch.allclose(matmul, sdpa, atol=1e-5)
    assert {m.kernel for m in model.modules() if hasattr(m, "kernel")} == {"matmul"}
    with pytest.raises(ValueError, match="attention kernel must be one of"):
        model.use_attention("flash")


def test_dropout_on_the_weights_keeps_the_expected_value():
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, 2, 6, 4) for _ in range(3))
    plain = matmul_attention(q, k, v, None, False)
    dropped = torch.stack([matmul_attention(q, k, v, None, False, p=0.5) for _ in range(200)]).mean(
        0
    )
    assert (dropped - plain).abs().mean() < 0.05  # inverted dropout: unbiased

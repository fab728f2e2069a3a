from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mtkit.model.loss
from mtkit.model.loss import label_smoothed_nll, output_and_loss
from mtkit.model.transformer import Projection


def test_hand_computed_example():
    # Two classes plus pad (id 0); uniform logits -> every class has p = 1/3.
    logits = torch.zeros(1, 2, 3)
    target = torch.tensor([[1, 0]])  # second position is padding
    out = label_smoothed_nll(logits, target, eps=0.3)
    assert out.tokens == 1
    assert out.nll.item() == pytest.approx(math.log(3))
    # (1 - eps) * log 3 + eps * mean(log 3, log 3, log 3) = log 3
    assert out.loss.item() == pytest.approx(math.log(3))
    logits = torch.tensor([[[0.0, math.log(3.0), 0.0]]])  # p = (0.2, 0.6, 0.2)
    out = label_smoothed_nll(logits, torch.tensor([[1]]), eps=0.3)
    expected = 0.7 * -math.log(0.6) + 0.3 * (-(math.log(0.2) * 2 + math.log(0.6)) / 3)
    assert out.loss.item() == pytest.approx(expected)
    assert out.nll.item() == pytest.approx(-math.log(0.6))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.25])
def test_agrees_with_torch_cross_entropy(eps):
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 11)
    target = torch.randint(1, 11, (4, 7))
    target[0, 5:] = 0
    target[2, 3:] = 0
    ours = label_smoothed_nll(logits, target, eps)
    ref = F.cross_entropy(
        logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum"
    )
    assert ours.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert ours.nll.item() == pytest.approx(nll.item(), rel=1e-5)
    assert ours.tokens == int((target != 0).sum())


def test_padding_positions_get_no_gradient():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    target = torch.tensor([[1, 2, 0], [3, 0, 0]])
    label_smoothed_nll(logits, target).loss.backward()
    assert logits.grad[0, 2].abs().sum() == 0 and logits.grad[1, 1:].abs().sum() == 0
    assert logits.grad[0, 0].abs().sum() > 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_hand_written_gradient_matches_autograd(eps):
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 13, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 5))
    target[1, 2:] = 0
    out = label_smoothed_nll(logits, target, eps)
    (out.loss + 0.5 * out.nll).backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(
        logits.view(-1, 13), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum"
    )
    ref = ref + 0.5 * F.cross_entropy(
        logits.view(-1, 13), target.view(-1), ignore_index=0, reduction="sum"
    )
    ref.backward()
    assert torch.allclose(ours, logits.grad, atol=1e-10)
    assert torch.autograd.gradcheck(
        lambda z: label_smoothed_nll(z, target, eps).loss, (logits.detach().requires_grad_(),)
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_a_projection_in_chunks_gives_the_loss_and_gradients_of_its_logits(eps, monkeypatch):
    monkeypatch.setattr(mtkit.model.loss, "CHUNK_ELEMENTS", 16 * 13)  # 16 rows per chunk
    torch.manual_seed(2)
    hidden = torch.randn(3, 20, 6, dtype=torch.float64, requires_grad=True)  # 60 rows
    weight = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (3, 20))
    target[0, 9:] = 0
    target[2, 17:] = 0  # pad rows inside and across chunk boundaries
    full = label_smoothed_nll(F.linear(hidden, weight), target, eps)
    (0.25 * full.loss).backward()
    expected = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    chunked = output_and_loss(Projection(hidden, weight), target, eps)
    (0.25 * chunked.loss).backward()
    assert chunked.tokens == full.tokens == int((target != 0).sum())
    assert chunked.loss.item() == pytest.approx(full.loss.item(), rel=1e-6)
    assert chunked.nll.item() == pytest.approx(full.nll.item(), rel=1e-6)
    assert torch.allclose(hidden.grad, expected[0], atol=1e-6)
    assert torch.allclose(weight.grad, expected[1], atol=1e-6)
    assert hidden.grad[0, 9:].abs().sum() == 0  # pad positions get no gradient


def test_a_projection_under_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(3)
    hidden = torch.randn(64, 32, requires_grad=True)
    weight = (torch.randn(50, 32) * 0.1).requires_grad_()
    target = torch.randint(1, 50, (64,))
    target[40:] = 0  # pad rows
    fp32 = output_and_loss(Projection(hidden, weight), target)
    fp32.loss.backward()
    expected = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = output_and_loss(Projection(hidden, weight), target)
    assert bf16.loss.dtype == torch.float32
    assert bf16.loss.item() == pytest.approx(fp32.loss.item(), rel=2e-2)
    bf16.loss.backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert hidden.grad[40:].abs().sum() == 0  # pad rows get no gradient
    assert torch.allclose(hidden.grad, expected[0], atol=2e-2)
    assert torch.allclose(weight.grad, expected[1], atol=5e-2)


def test_a_projection_without_gradients_gives_the_same_loss(monkeypatch):
    monkeypatch.setattr(mtkit.model.loss, "CHUNK_ELEMENTS", 8 * 13)  # 8 rows per chunk
    torch.manual_seed(4)
    hidden, weight = torch.randn(2, 15, 6), torch.randn(13, 6, requires_grad=True)
    target = torch.randint(0, 13, (2, 15))
    with torch.no_grad():
        chunked = output_and_loss(Projection(hidden, weight), target, 0.1)
        full = label_smoothed_nll(F.linear(hidden, weight), target, 0.1)
    assert not chunked.loss.requires_grad
    assert chunked.loss.item() == pytest.approx(full.loss.item(), rel=1e-6)
    assert chunked.nll.item() == pytest.approx(full.nll.item(), rel=1e-6)

"""The fused vocabulary loss (``sparsenorm.fused_linear_loss``) on the device against a float64
materialised oracle on CPU: loss and gradients for every streamable normalizer, vocabularies longer
than the Triton block kernel's chunk (softmax and ev-softmax run their rows through it on CUDA),
ignored targets, both reductions. Bound: the float32 error model of the unit tests
(``tests/unit/test_linear_loss.py``'s ``_tol``): the logits' rounding (d products of magnitude |h| |w|),
propagated through the normalizer and the gradient's sums over V and N."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import sparsenorm
from sparsenorm import registry
from sparsenorm.linear_loss import streamable_normalizers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from linear_loss_checks import error_bound as float32_error_model  # noqa: E402  (the unit tests' float32 bound)

pytestmark = [pytest.mark.cuda]


@pytest.mark.parametrize("name", streamable_normalizers())
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_loss_on_the_device_against_float64(device, name, reduction):
    gen = torch.Generator().manual_seed(7)
    n, d, v = 48, 32, 5000  # 5000 > the block kernel's 4096-entry chunk
    h = torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.5
    w = torch.randn(v, d, generator=gen, dtype=torch.float64) * 0.5
    y = torch.randint(0, v, (n,), generator=gen)
    y[3] = -100
    h64, w64 = h.clone().requires_grad_(), w.clone().requires_grad_()
    oracle = registry.get(name).single_label_loss(torch.nn.functional.linear(h64, w64), y, reduction=reduction)
    probe = torch.randn(oracle.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((oracle * probe).sum(), (h64, w64))

    hd, wd = (t.float().to(device).requires_grad_() for t in (h, w))
    got = sparsenorm.fused_linear_loss(hd, wd, y.to(device), normalizer=name, reduction=reduction)
    grads = torch.autograd.grad((got * probe.float().to(device)).sum(), (hd, wd))
    bound = float32_error_model(h, w, torch.float32)
    assert got.device.type == torch.device(device).type
    assert float((got.double().cpu() - oracle.detach()).abs().max()) <= bound, "loss"
    for g, r, what in zip(grads, want, ("grad hidden", "grad weight")):
        err = float((g.double().cpu() - r).abs().max())
        assert err <= bound, f"{what}: {err:.3g} > {bound:.3g}"

"""No host synchronisation in any public function or loss off the CPU (issue 9, item 4).

A "meta" tensor has a shape and no data: reading a value (``.item()``, ``bool(t)``, ``int(t)``, a
data-dependent branch) raises. Every normalizer and loss, forward and backward, runs on meta
inputs through the same entry path and operators as on an accelerator (the operators' reference
implementation), so a passing run shows that path never reads a value on the host. (The CPU
implementations may read row counts: on a CPU that is not a device synchronisation.)
"""
from __future__ import annotations

import pytest
import torch

import test_compile
from test_compile import LOSSES, NORMALIZERS


@pytest.fixture
def meta_targets(monkeypatch):
    monkeypatch.setattr(test_compile, "TARGET", test_compile.TARGET.to("meta"))
    monkeypatch.setattr(test_compile, "MULTI_HOT", test_compile.MULTI_HOT.to("meta"))


@pytest.mark.parametrize("name", list(NORMALIZERS) + list(LOSSES))
def test_runs_on_meta_tensors_forward_and_backward(name, meta_targets):
    fn = {**NORMALIZERS, **LOSSES}[name]
    x = torch.randn(4, 6, device="meta", requires_grad=True)
    mask = torch.ones(4, 6, dtype=torch.bool, device="meta")
    y = fn(x, mask)
    assert y.device.type == "meta"
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert grad.shape == x.shape


def test_meta_tensors_do_catch_a_host_read():
    with pytest.raises(Exception):
        bool(torch.ones(2, device="meta").any())

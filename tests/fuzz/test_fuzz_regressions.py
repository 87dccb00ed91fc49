"""Minimal examples of what the fuzz suite found (issue 25, item 3), one plain test each."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

import sparsenorm as sn
from sparsenorm import kernels, registry
from sparsenorm.kernels.reference.rsoftmax import _order_statistics


def test_registry_softmax_keeps_a_row_of_only_nan_nan():
    # found: softmax over dim 0 of [[0, nan]]: the column [nan] gave 0 (it counted as "nothing
    # there"), though NaN is there by the library's rule and must stay in its row
    x = torch.tensor([[0.0, math.nan]], dtype=torch.float16)
    for form in (registry.get("softmax").forward, registry.get("softmax").log_prob):
        out = form(x, dim=0)
        assert torch.isnan(out[0, 1]) and not torch.isnan(out[0, 0])


def test_r_softmax_ties_at_the_quantile_give_one_gradient_on_kernel_and_reference():
    # found: x = (0, 0, 0, 1, 0.5), r = 0 in float16: d tau / d x went to entry 0 on the kernel and
    # to entry 2 on the CPU reference (torch.topk orders ties arbitrarily), so the gradients differed
    x = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.5], dtype=torch.float16, requires_grad=True)
    g = torch.tensor([0.1, -0.4, 0.3, 0.9, -0.2], dtype=torch.float16)
    (kernel,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    with kernels.disabled():
        (reference,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    torch.testing.assert_close(kernel, reference, rtol=0, atol=0)


def test_order_statistics_indices_are_those_of_the_stable_sort():
    rows = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.5], [2.0, 1.0, 1.0, 1.0, 3.0], [1.0, 1.0, 0.0, 1.0, 1.0]])
    order = torch.sort(rows, dim=-1, stable=True).indices
    for rank in range(rows.shape[-1]):
        for r in (rank, torch.full((3, 1), rank)):
            _, _, lo_idx, hi_idx = _order_statistics(rows, r)
            assert lo_idx.squeeze(-1).tolist() == order[:, rank].tolist()
            assert hi_idx.squeeze(-1).tolist() == order[:, min(rank + 1, 4)].tolist()


def test_log_ev_softmax_train_kernel_is_as_accurate_as_log_softmax_at_large_scores():
    # found: x = (512, 512) in float32 gave log p = -0.693176 on the C++ kernel (log 1/2 = -0.693147):
    # it subtracted max + log(sum), rounded to the ulp of 512; now (x - max) - log(sum), as torch
    x = torch.tensor([512.0, 512.0])
    assert sn.log_ev_softmax_train(x).tolist() == torch.log_softmax(x, -1).tolist()
    x = torch.tensor([1e4, 1e4 - 0.25, 1e4 - 3.0])  # the first two on the support (mean 1e4 - 1.08)
    exact = torch.log_softmax(x[:2].double(), -1)
    got = sn.log_ev_softmax_train(x, eps=0.0).double()
    assert got[2] == float("-inf")
    assert (got[:2] - exact).abs().max() <= 4 * torch.finfo(torch.float32).eps  # was ~5e-4: the ulp of 1e4


def test_r_softmax_gradient_with_a_subnormal_weight_is_the_same_on_kernel_and_reference():
    # found: the column (0.5, 0, 0, 0, 0, 9.2e-41) in bfloat16 with r = 0 (tau = 0): the reference
    # divided by max(w, tiny) instead of the subnormal weight w = 9.2e-41, and gave the last two
    # entries a gradient of -0.0045/0.0045 instead of the kernel's -0.574/0.574
    x = torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, 9.1835e-41], dtype=torch.bfloat16, requires_grad=True)
    g = torch.tensor([0.2, -0.9, 0.1, 0.4, -0.3, 0.7], dtype=torch.bfloat16)
    (kernel,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    with kernels.disabled():
        (reference,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    exact_x = x.detach().float().requires_grad_(True)  # the weight is subnormal in float32 too
    (exact,) = torch.autograd.grad(sn.r_softmax(exact_x.double(), 0.0), exact_x, g.float())
    for got in (kernel, reference):
        torch.testing.assert_close(got.float(), exact, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_r_and_t_softmax_gradient_where_the_output_is_subnormal(path):
    # found: x = (0, 0.5, 1.4e-45) in float32 with r = 0 (tau = 0, the last weight 1.4e-45): the
    # backward's e = p / w divided a subnormal p (a multiple of 1.4e-45, all digits lost) by w and
    # gave the gradient (1, 0, -1) on the kernel and (0, 0, 0) on the reference, where the exact
    # one is (0.381, 0, -0.381); now e = exp(x - max) / sum(w exp(x - max)) where p is subnormal
    x = torch.tensor([0.0, 0.5, 1.4013e-45], requires_grad=True)
    g = torch.tensor([0.5684, -1.0845, -1.3986])
    x64 = x.detach().double().requires_grad_(True)
    with kernels.disabled() if path == "reference" else contextlib.nullcontext():
        for fn in (lambda v: sn.r_softmax(v, 0.0), lambda v: sn.t_softmax(v, 0.5)):  # both tau = 0
            (got,) = torch.autograd.grad(fn(x), x, g)
            (exact,) = torch.autograd.grad(fn(x64), x64, g.double())
            # an O(1) Jacobian computed from normal numbers: a few float32 roundings
            torch.testing.assert_close(got.double(), exact, rtol=0, atol=8 * 4 * torch.finfo(torch.float32).eps)


def test_softmax_multilabel_loss_with_an_unlabelled_class_not_there():
    # found: the registry's softmax multi-label loss on logits (-inf,) with no label gave NaN
    # (F.cross_entropy's 0 * log 0); a class not there, unlabelled, adds 0 to the loss
    logits = torch.tensor([[-math.inf, 1.0, 2.0], [-math.inf, -math.inf, -math.inf]], requires_grad=True)
    target = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    loss = registry.get("softmax").multi_label_loss(logits, target, reduction="none")
    expected = -torch.log_softmax(torch.tensor([1.0, 2.0]), -1).mean()
    torch.testing.assert_close(loss, torch.stack([expected, torch.tensor(0.0)]))
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert torch.isfinite(grad).all() and (grad[:, 0] == 0).all() and (grad[1] == 0).all()


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_r_softmax_loss_ignored_row_with_an_overflowing_jacobian_has_zero_gradient(path):
    # found: logits (0, 1.4e-45) with the target ignored: the weight 1.4e-45 makes e = p / w
    # overflow to inf, and the zero cotangent of the ignored row gave inf * 0 = NaN gradients
    logits = torch.tensor([[0.0, 1.4013e-45], [0.0, 1.0]], requires_grad=True)
    target = torch.tensor([-100, 1])
    with kernels.disabled() if path == "reference" else contextlib.nullcontext():
        loss = sn.r_softmax_loss(logits, target)
        (grad,) = torch.autograd.grad(loss, logits)
    assert (grad[0] == 0).all() and torch.isfinite(grad[1]).all()


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_r_softmax_row_with_only_a_subnormal_weight_sums_to_one(path):
    # found: logits (0, 1.4e-45), r = 0.5 (tau = 0, the only weight 1.4e-45): the reference
    # computed softmax(x) * w = 0.5 * 1.4e-45, which rounds to 0, and returned the row (0, 0)
    # (so r_softmax_loss gave 2 on the reference and 1 on the kernel); now w exp(x - max)
    x = torch.tensor([0.0, 1.4013e-45])
    with kernels.disabled() if path == "reference" else contextlib.nullcontext():
        assert sn.r_softmax(x, 0.5).tolist() == [0.0, 1.0]
        assert sn.r_softmax_loss(x.unsqueeze(0), torch.tensor([1]), reduction="none").tolist() == [1.0]


def test_marginalize_with_no_classes_gives_zeros_instead_of_a_reshape_error():
    # found: probs of shape (2, 0) (or (0,)) raised "cannot reshape tensor of 0 elements into shape
    # [-1, 0]" deep inside marginalize; an empty class dim is an empty sum: zeros, fn called once
    from sparsenorm.marginalize import marginalize

    calls = []

    def fn(example_index, class_index):
        calls.append(example_index.numel())
        return torch.zeros(example_index.shape[0], 3)

    out, stats = marginalize(torch.zeros(2, 0), fn, return_stats=True)
    assert out.shape == (2, 3) and torch.equal(out, torch.zeros(2, 3))
    assert stats.rows == 0 and calls == [0]
    assert marginalize(torch.zeros(0), lambda e, c: torch.zeros(e.shape[0])).shape == ()

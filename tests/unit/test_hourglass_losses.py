"""Sparsehourglass hinge losses (Laha et al. 2018), multi-class and multi-label."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from sparsenorm import sparsehourglass
from sparsenorm.losses import (
    SparseHourglassHingeLoss,
    SparseHourglassMultilabelHingeLoss,
    sparsehourglass_hinge_loss,
    sparsehourglass_multilabel_hinge_loss,
)


def alpha_of(z, q):
    k = z.numel()
    return (1 + q * k) / (abs(float(z.sum())) + q * k)


def literal_multiclass(z, y, q):
    """README: sum_j max(1{j != y} - alpha z_y + alpha z_j, 0) / alpha, one row."""
    a = alpha_of(z, q)
    return sum(max(float(j != y) - a * float(z[y]) + a * float(z[j]), 0.0) for j in range(len(z))) / a


def literal_multilabel(z, y, q):
    """README pairwise hinge with rho = eta = y / |y| (the target output), one row."""
    a = alpha_of(z, q)
    eta = y / y.sum()
    total = 0.0
    for i in range(len(z)):
        for j in range(len(z)):
            d = float((eta[i] - eta[j]) / a - (z[i] - z[j]))
            if y[i] == 1 and y[j] == 1:
                total += abs(d) / 2
            elif y[i] == 1 and y[j] == 0:
                total += max(d, 0.0)
    return total


def logits(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def multi_hot(n, c, seed=0):
    y = (torch.rand(n, c, generator=torch.Generator().manual_seed(seed)) < 0.4).double()
    y[:, 0] = 1.0
    return y


# ---------------------------------------------------------------------------- definitions
@pytest.mark.parametrize("q", [0.1, 1.0, 4.0])
def test_multiclass_matches_readme(q):
    z = logits(7, 5, seed=1) * 2
    y = torch.randint(0, 5, (7,), generator=torch.Generator().manual_seed(2))
    expected = torch.tensor([literal_multiclass(z[i], int(y[i]), q) for i in range(7)], dtype=torch.float64)
    torch.testing.assert_close(sparsehourglass_hinge_loss(z, y, q=q, reduction="none"), expected)


@pytest.mark.parametrize("q", [0.1, 1.0, 4.0])
def test_multilabel_matches_readme(q):
    z, y = logits(6, 6, seed=3), multi_hot(6, 6, seed=4)
    expected = torch.tensor([literal_multilabel(z[i], y[i], q) for i in range(6)], dtype=torch.float64)
    torch.testing.assert_close(sparsehourglass_multilabel_hinge_loss(z, y, q=q, reduction="none"), expected)


# ---------------------------------------------------------------------------- zero iff perfect, non-negative
@settings(max_examples=60, deadline=None)
@given(data=st.data(), c=st.integers(2, 7), q=st.floats(0.05, 5), scale=st.sampled_from([0.1, 1.0, 10.0, 100.0]))
def test_multiclass_nonnegative_and_zero_iff_one_hot(data, c, q, scale):
    z = torch.tensor(data.draw(st.lists(st.integers(-50, 50), min_size=c, max_size=c)), dtype=torch.float64) * scale / 8
    y = data.draw(st.integers(0, c - 1))
    loss = float(sparsehourglass_hinge_loss(z.unsqueeze(0), torch.tensor([y]), q=q))
    assert loss >= 0
    one_hot = torch.equal(sparsehourglass(z, q), F.one_hot(torch.tensor(y), c).double())
    assert (loss == 0) == one_hot


def test_multilabel_zero_iff_output_is_eta():
    y = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    z = torch.tensor([[5.0, 5.0, 5.0, -10.0, -10.0]], dtype=torch.float64)
    torch.testing.assert_close(sparsehourglass(z), y / 3)
    assert float(sparsehourglass_multilabel_hinge_loss(z, y)) == 0.0
    # positives not tied (output != eta), or a negative too close: positive loss
    assert float(sparsehourglass_multilabel_hinge_loss(z + torch.tensor([[0.0, 0.3, 0, 0, 0]]).double(), y)) > 0
    assert float(sparsehourglass_multilabel_hinge_loss(torch.tensor([[5.0, 5.0, 5.0, 4.99, -10.0]]).double(), y)) > 0


@settings(max_examples=60, deadline=None)
@given(data=st.data(), c=st.integers(2, 7), q=st.floats(0.05, 5))
def test_multilabel_nonnegative(data, c, q):
    z = torch.tensor(data.draw(st.lists(st.floats(-30, 30), min_size=c, max_size=c)), dtype=torch.float64)
    y = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=c, max_size=c)), dtype=torch.float64)
    loss = float(sparsehourglass_multilabel_hinge_loss(z.unsqueeze(0), y.unsqueeze(0), q=q))
    assert loss >= 0
    if y.sum() == 0:
        assert loss == 0.0  # no positive label: no pair


# ---------------------------------------------------------------------------- gradients
def test_gradcheck():
    z = logits(5, 6, seed=5).requires_grad_()
    y = torch.tensor([0, 5, 2, 2, 3])
    w = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) + 0.5
    assert gradcheck(lambda v: sparsehourglass_hinge_loss(v, y, q=0.7), (z,))
    assert gradcheck(lambda v: sparsehourglass_hinge_loss(v, y, q=0.7, weight=w, reduction="sum"), (z,))
    Y = multi_hot(5, 6, seed=7)
    assert gradcheck(lambda v: sparsehourglass_multilabel_hinge_loss(v, Y, q=0.7), (z,))
    q = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, qq: sparsehourglass_multilabel_hinge_loss(v, Y, q=qq), (z, q))
    assert gradcheck(lambda v, qq: sparsehourglass_hinge_loss(v, y, q=qq), (z, q))


# ---------------------------------------------------------------------------- conventions
def test_reductions_weight_ignore_index_extra_dims():
    z = logits(6, 5, seed=8)
    y = torch.tensor([0, 4, -1, 2, 3, -1])
    none = sparsehourglass_hinge_loss(z, y, ignore_index=-1, reduction="none")
    kept = y != -1
    assert none.shape == (6,) and bool((none[~kept] == 0).all())
    torch.testing.assert_close(sparsehourglass_hinge_loss(z, y, ignore_index=-1), none[kept].mean())
    torch.testing.assert_close(sparsehourglass_hinge_loss(z, y, ignore_index=-1, reduction="sum"), none.sum())
    w = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=torch.float64)
    weighted = sparsehourglass_hinge_loss(z, y, weight=w, ignore_index=-1)
    torch.testing.assert_close(weighted, (none[kept] * w[y[kept]]).sum() / w[y[kept]].sum())
    # (N, C, d) = flattened rows
    z3 = logits(2, 5, 3, seed=9)
    y3 = torch.randint(0, 5, (2, 3), generator=torch.Generator().manual_seed(10))
    out = sparsehourglass_hinge_loss(z3, y3, reduction="none")
    assert out.shape == (2, 3)
    flat = sparsehourglass_hinge_loss(z3.movedim(1, -1).reshape(-1, 5), y3.reshape(-1), reduction="none")
    torch.testing.assert_close(out.reshape(-1), flat)
    Y3 = (torch.rand(2, 5, 3, generator=torch.Generator().manual_seed(11)) < 0.5).double()
    out = sparsehourglass_multilabel_hinge_loss(z3, Y3, reduction="none")
    flat = sparsehourglass_multilabel_hinge_loss(z3.movedim(1, -1).reshape(-1, 5), Y3.movedim(1, -1).reshape(-1, 5),
                                                 reduction="none")
    torch.testing.assert_close(out.reshape(-1), flat)
    # multi-label with class indices = one-hot targets
    idx = torch.tensor([1, 0, 3, 4, 2, 2])
    torch.testing.assert_close(sparsehourglass_multilabel_hinge_loss(z, idx),
                               sparsehourglass_multilabel_hinge_loss(z, F.one_hot(idx, 5).double()))


def test_masked_classes():
    z = torch.tensor([[2.0, float("-inf"), 0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    y, keep = torch.tensor([0]), [0, 2, 3]
    torch.testing.assert_close(sparsehourglass_hinge_loss(z, y), sparsehourglass_hinge_loss(z[:, keep], y))
    Y = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    loss = sparsehourglass_multilabel_hinge_loss(z, Y)
    torch.testing.assert_close(loss, sparsehourglass_multilabel_hinge_loss(z[:, keep], Y[:, keep]))
    loss.backward()
    assert torch.isfinite(z.grad).all()


def test_errors():
    z = logits(4, 5)
    with pytest.raises(TypeError):
        sparsehourglass_hinge_loss(z, multi_hot(4, 5))  # the multi-class loss takes class indices
    with pytest.raises(ValueError, match="shape"):
        sparsehourglass_hinge_loss(z, torch.zeros(3, dtype=torch.long))
    with pytest.raises(IndexError):
        sparsehourglass_hinge_loss(z, torch.tensor([0, 1, 7, 2]))
    with pytest.raises(ValueError, match="shape"):
        sparsehourglass_multilabel_hinge_loss(z, multi_hot(4, 6))
    with pytest.raises(TypeError):
        sparsehourglass_multilabel_hinge_loss(z.long(), multi_hot(4, 5))
    for q in (0.0, -2.0):
        with pytest.raises(ValueError, match="q"):
            sparsehourglass_hinge_loss(z, torch.zeros(4, dtype=torch.long), q=q)
        with pytest.raises(ValueError, match="q"):
            sparsehourglass_multilabel_hinge_loss(z, multi_hot(4, 5), q=q)
    with pytest.raises(ValueError, match="reduction"):
        sparsehourglass_hinge_loss(z, torch.zeros(4, dtype=torch.long), reduction="batchmean")
    with pytest.raises(ValueError, match="weight"):
        sparsehourglass_hinge_loss(z, torch.zeros(4, dtype=torch.long), weight=torch.ones(3))


def test_modules_and_training():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(64, 10, generator=g)
    scores = x @ torch.randn(10, 6, generator=g)
    y_single = scores.argmax(-1)
    y_multi = (scores > scores.quantile(0.6, dim=1, keepdim=True)).float()
    for loss_fn, y in ((SparseHourglassHingeLoss(q=1.0), y_single),
                       (SparseHourglassMultilabelHingeLoss(q=1.0), y_multi)):
        model = torch.nn.Linear(10, 6)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        losses = []
        for _ in range(40):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.6 * losses[0]


# ---------------------------------------------------------------------------- the sorted pair sums
@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 9), st.integers(1, 6))
def test_sorted_pair_sums_equal_the_pair_tensor_form(data, c, rows):
    """O(C log C) pair sums against the direct (M, C, C) sums, with ties, masked classes and empty sets."""
    from sparsenorm.losses.hourglass import pair_classes, positive_negative_hinge, positive_pair_spread

    values = st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0, float("-inf")])  # small set: many ties
    z = torch.tensor(data.draw(st.lists(st.lists(values, min_size=c, max_size=c), min_size=rows, max_size=rows)),
                     dtype=torch.float64)
    positive = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=c, max_size=c),
                                               min_size=rows, max_size=rows)))
    margin = torch.tensor(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=c, max_size=c),
                                             min_size=rows, max_size=rows)), dtype=torch.float64)
    pos, neg, bad = pair_classes(z, positive)
    zf = z.masked_fill(z == float("-inf"), 0.0)
    direct_hinge = torch.where(pos.unsqueeze(2) & neg.unsqueeze(1),
                               (margin.unsqueeze(2) - (zf.unsqueeze(2) - zf.unsqueeze(1))).clamp_min(0),
                               0.0).sum((1, 2))
    torch.testing.assert_close(positive_negative_hinge(z, pos, neg, margin), direct_hinge)
    u = torch.where(pos, margin - zf, 0.0)
    direct_spread = torch.where(pos.unsqueeze(2) & pos.unsqueeze(1), (u.unsqueeze(2) - u.unsqueeze(1)).abs(),
                                0.0).sum((1, 2)) / 2
    torch.testing.assert_close(positive_pair_spread(u, pos), direct_spread)
    assert bad.tolist() == (positive & (z == float("-inf"))).any(1).tolist()


def test_sorted_pair_sums_gradcheck():
    from sparsenorm.losses.hourglass import positive_negative_hinge, positive_pair_spread

    z = logits(4, 7, seed=3).requires_grad_()
    margin = torch.rand(4, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    pos = multi_hot(4, 7, seed=2).bool()
    assert gradcheck(lambda z, m: positive_negative_hinge(z, pos, ~pos, m), (z, margin))
    assert gradcheck(lambda u: positive_pair_spread(u, pos), (z,))

"""The r-softmax paper's multi-label loss (Eq. 4) for r-/t-softmax, and the sparsity-rate predictor (Sec. 4.1)."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from sparsenorm import r_softmax, t_softmax
from sparsenorm.losses import RSoftmaxLoss, SparsityRatePredictor, TSoftmaxLoss, r_softmax_loss, t_softmax_loss


def literal_eq4(z, y, p):
    """Eq. 4 for one row, term by term, given the normalizer's output p."""
    eta = y / y.sum() if y.sum() > 0 else torch.zeros_like(y)
    loss = ((y * (p - eta)) ** 2).sum()
    for i in range(len(z)):
        for j in range(len(z)):
            if y[i] == 1 and y[j] == 0:
                loss = loss + torch.clamp(eta[i] - (z[i] - z[j]), min=0)
    return loss


def literal_r_softmax_row(z, r):
    tau = torch.quantile(z, torch.as_tensor(r, dtype=z.dtype))
    w = torch.relu(z - tau)
    num = w * torch.exp(z - z.max())
    return num / num.sum()


def multi_hot(n, c, seed=0, dtype=torch.float64):
    y = (torch.rand(n, c, generator=torch.Generator().manual_seed(seed)) < 0.4).to(dtype)
    y[:, 0] = 1.0  # at least one positive label
    return y


def logits(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------- definition
@pytest.mark.parametrize("r", [0.0, 0.3, 0.5, 0.8])
def test_r_softmax_loss_matches_literal_eq4(r):
    z, y = logits(6, 7, seed=1), multi_hot(6, 7, seed=2)
    expected = torch.stack([literal_eq4(z[i], y[i], literal_r_softmax_row(z[i], r)) for i in range(6)])
    torch.testing.assert_close(r_softmax_loss(z, y, r=r, reduction="none"), expected)
    torch.testing.assert_close(r_softmax_loss(z, y, r=r), expected.mean())


def test_t_softmax_loss_matches_literal_eq4():
    z, y = logits(5, 6, seed=3), multi_hot(5, 6, seed=4)
    p = t_softmax(z, 0.8)
    expected = torch.stack([literal_eq4(z[i], y[i], p[i]) for i in range(5)])
    torch.testing.assert_close(t_softmax_loss(z, y, t=0.8, reduction="none"), expected)


def test_per_example_r():
    z, y = logits(6, 7, seed=5), multi_hot(6, 7, seed=6)
    r = torch.tensor([0.1, 0.2, 0.45, 0.6, 0.75, 0.9], dtype=torch.float64)
    expected = torch.stack([literal_eq4(z[i], y[i], literal_r_softmax_row(z[i], r[i])) for i in range(6)])
    torch.testing.assert_close(r_softmax_loss(z, y, r=r, reduction="none"), expected)
    torch.testing.assert_close(r_softmax_loss(z, y, r=r.unsqueeze(1), reduction="none"), expected)
    with pytest.raises(ValueError, match="r must be"):
        r_softmax_loss(z, y, r=torch.full((5,), 0.5))


def test_class_indices_are_one_hot_targets():
    z = logits(8, 5, seed=7)
    idx = torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(r_softmax_loss(z, idx, r=0.4), r_softmax_loss(z, F.one_hot(idx, 5).double(), r=0.4))
    torch.testing.assert_close(t_softmax_loss(z, idx, t=2.0), t_softmax_loss(z, F.one_hot(idx, 5).double(), t=2.0))


def pairwise_eq4(z, y, p):
    """Eq. 4 for rows ``(M, C)`` through the ``(M, C, C)`` pair tensor: the direct form, no sort, no shortcut."""
    eta = y / y.sum(1, keepdim=True)
    fit = ((y * (p - eta)) ** 2).sum(1)
    pairs = (y[:, :, None] > 0) & (y[:, None, :] == 0)  # (i positive, j negative)
    hinge = (eta[:, :, None] - (z[:, :, None] - z[:, None, :])).clamp_min(0)
    return fit + torch.where(pairs, hinge, torch.zeros_like(hinge)).sum((1, 2))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(2, 12), st.floats(0.0, 0.95), st.integers(0, 2**16))
def test_class_index_form_equals_the_pairwise_form_with_gradients(n, c, r, seed):
    """Class-index targets take the O(C) single-label form; in float64 it equals the C x C form of Eq. 4
    (value and gradient w.r.t. the logits) to float64 rounding (assert_close's float64 tolerances)."""
    z = logits(n, c, seed=seed).requires_grad_()
    idx = torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(seed + 1))
    fast = r_softmax_loss(z, idx, r=r, reduction="none")
    direct = pairwise_eq4(z, F.one_hot(idx, c).double(), r_softmax(z, r))
    torch.testing.assert_close(fast, direct)
    weights = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 2))
    grad_fast, = torch.autograd.grad((fast * weights).sum(), z)
    grad_direct, = torch.autograd.grad((direct * weights).sum(), z)
    torch.testing.assert_close(grad_fast, grad_direct)


def test_class_index_form_with_per_example_t_masks_and_ignore_index():
    z = logits(5, 6, seed=20)
    z[1, 4] = float("-inf")  # a class not there, as a negative: no pair
    idx = torch.tensor([0, 2, 5, -100, 3])
    t = torch.tensor([0.5, 1.0, 2.0, 1.0, 0.7], dtype=torch.float64)
    kept = idx != -100
    out = t_softmax_loss(z, idx, t=t, reduction="none")
    direct = pairwise_eq4(z[kept], F.one_hot(idx[kept], 6).double(), t_softmax(z[kept], t[kept, None]))
    torch.testing.assert_close(out[kept], direct)
    assert float(out[3]) == 0.0  # ignored row
    # a positive class that is not there: +inf (as the multi-label form), and a finite gradient elsewhere
    z_bad = z.clone().requires_grad_()
    bad = t_softmax_loss(z_bad, torch.tensor([0, 4, 5, 1, 3]), t=t, reduction="none")
    assert float(bad[1].detach()) == float("inf") and torch.isfinite(bad[[0, 2, 3, 4]]).all()
    grad, = torch.autograd.grad(bad[[0, 2, 3, 4]].sum(), z_bad)
    assert torch.isfinite(grad).all()


def test_gradcheck_class_index_form_extra_dims_and_mask():
    z = logits(2, 5, 3, seed=21).requires_grad_()
    idx = torch.tensor([[0, 4, 2], [1, 1, 3]])
    mask = torch.ones(2, 5, 3, dtype=torch.bool)
    mask[0, 3, :] = False
    assert gradcheck(lambda v: r_softmax_loss(v, idx, r=0.35, mask=mask, reduction="none"), (z,))
    r = torch.tensor([[0.2, 0.5, 0.7], [0.1, 0.4, 0.6]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, rr: r_softmax_loss(v, idx, r=rr), (z, r))


# ---------------------------------------------------------------------------- paper properties
@settings(max_examples=60, deadline=None)
@given(data=st.data(), c=st.integers(2, 8), r=st.floats(0, 1), t=st.floats(0.05, 5))
def test_non_negative(data, c, r, t):
    z = torch.tensor(data.draw(st.lists(st.floats(-30, 30), min_size=c, max_size=c)), dtype=torch.float64)
    y = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=c, max_size=c)), dtype=torch.float64)
    assert float(r_softmax_loss(z.unsqueeze(0), y.unsqueeze(0), r=r)) >= 0
    assert float(t_softmax_loss(z.unsqueeze(0), y.unsqueeze(0), t=t)) >= 0


def test_zero_at_perfect_prediction():
    # two positive labels of four; r = 1/2 zeroes the two negatives and the positives tie:
    # r-softmax = eta = (1/2, 1/2, 0, 0) and every margin z_i - z_j = 5 >= eta_i.
    z = torch.tensor([[5.0, 5.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(r_softmax(z, 0.5), y / 2)
    assert float(r_softmax_loss(z, y, r=0.5)) == 0.0
    assert float(t_softmax_loss(z, y, t=1.0)) == 0.0  # t = 1 < 5: negatives are 0 too
    # a margin below eta_i, or the wrong rate, gives a positive loss
    assert float(r_softmax_loss(torch.tensor([[5.0, 5.0, 4.8, 0.0]], dtype=torch.float64), y, r=0.5)) > 0
    assert float(r_softmax_loss(z + torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64), y, r=0.5)) > 0


def test_row_without_positive_label_gives_zero():
    z = logits(2, 4, seed=9)
    y = torch.tensor([[0.0, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.float64)
    out = r_softmax_loss(z, y, r=0.5, reduction="none")
    assert float(out[0]) == 0.0 and float(out[1]) > 0


# ---------------------------------------------------------------------------- gradients
def test_gradcheck_logits():
    z, y = logits(4, 6, seed=10).requires_grad_(), multi_hot(4, 6, seed=11)
    assert gradcheck(lambda v: r_softmax_loss(v, y, r=0.45), (z,))
    assert gradcheck(lambda v: t_softmax_loss(v, y, t=0.9), (z,))
    idx = torch.tensor([0, 3, 5, 1])
    assert gradcheck(lambda v: r_softmax_loss(v, idx, r=0.3, reduction="sum"), (z,))


def test_gradcheck_r_and_t():
    z, y = logits(4, 6, seed=12).requires_grad_(), multi_hot(4, 6, seed=13)
    r = torch.tensor([0.15, 0.45, 0.55, 0.75], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, rr: r_softmax_loss(v, y, r=rr, reduction="none"), (z, r))
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda v, tt: t_softmax_loss(v, y, t=tt), (z, t))


# ---------------------------------------------------------------------------- conventions
def test_reductions_ignore_index_extra_dims():
    z, y = logits(6, 5, seed=14), multi_hot(6, 5, seed=15)
    none = r_softmax_loss(z, y, reduction="none")
    assert none.shape == (6,)
    torch.testing.assert_close(r_softmax_loss(z, y, reduction="sum"), none.sum())
    torch.testing.assert_close(r_softmax_loss(z, y, reduction="elementwise_mean"), none.mean())
    # ignore_index on class-index targets, negative values included
    idx = torch.tensor([0, 2, -1, 4, -1, 1])
    kept = idx != -1
    torch.testing.assert_close(r_softmax_loss(z, idx, ignore_index=-1), r_softmax_loss(z[kept], idx[kept]))
    assert float(r_softmax_loss(z, idx, ignore_index=-1, reduction="none")[2]) == 0.0
    # (N, C, d) equals the flattened (N * d, C) rows
    z3 = logits(3, 5, 4, seed=16)
    y3 = (torch.rand(3, 5, 4, generator=torch.Generator().manual_seed(17)) < 0.5).double()
    flat_z, flat_y = z3.movedim(1, -1).reshape(-1, 5), y3.movedim(1, -1).reshape(-1, 5)
    out = t_softmax_loss(z3, y3, t=1.5, reduction="none")
    assert out.shape == (3, 4)
    torch.testing.assert_close(out.reshape(-1), t_softmax_loss(flat_z, flat_y, t=1.5, reduction="none"))
    # per-example r for extra dims: the unreduced loss's shape
    r = torch.rand(3, 4, dtype=torch.float64)
    torch.testing.assert_close(r_softmax_loss(z3, y3, r=r, reduction="none").reshape(-1),
                               r_softmax_loss(flat_z, flat_y, r=r.reshape(-1), reduction="none"))


def test_masked_classes():
    z = torch.tensor([[2.0, float("-inf"), 0.5, -1.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    # a -inf class is not there: same loss as without it
    torch.testing.assert_close(r_softmax_loss(z, y, r=0.4), r_softmax_loss(z[:, [0, 2, 3]], y[:, [0, 2, 3]], r=0.4))
    # a positive label on a -inf class cannot be fitted: +inf, not NaN
    assert float(r_softmax_loss(z, torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64))) == float("inf")


def test_errors():
    z, y = logits(4, 5), multi_hot(4, 5)
    with pytest.raises(ValueError, match="shape"):
        r_softmax_loss(z, y[:, :4])
    with pytest.raises(ValueError, match="shape"):
        r_softmax_loss(z, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError):
        r_softmax_loss(z.long(), y)
    with pytest.raises(ValueError, match="reduction"):
        r_softmax_loss(z, y, reduction="avg")
    with pytest.raises(ValueError, match="r"):
        r_softmax_loss(z, y, r=1.5)
    with pytest.raises(ValueError, match="t"):
        t_softmax_loss(z, y, t=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        r_softmax_loss(z, -y)


def test_low_precision_loss():
    z, y = logits(4, 6, seed=18).to(torch.bfloat16), multi_hot(4, 6, seed=19).to(torch.bfloat16)
    out = r_softmax_loss(z, y)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out)


# ---------------------------------------------------------------------------- training
def _tiny_problem(c=6, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    teacher = torch.randn(10, c, generator=g)
    scores = x @ teacher
    y = (scores > scores.quantile(0.6, dim=1, keepdim=True)).float()  # 2-3 labels per example
    return x, y


@pytest.mark.parametrize("make_loss", [lambda: RSoftmaxLoss(r=0.5), lambda: TSoftmaxLoss(t=1.0),
                                       lambda: TSoftmaxLoss(t=1.0, learnable=True)])
def test_training_reduces_loss(make_loss):
    torch.manual_seed(0)
    x, y = _tiny_problem()
    model, loss_fn = torch.nn.Linear(10, 6), make_loss()
    opt = torch.optim.Adam(list(model.parameters()) + list(loss_fn.parameters()), lr=0.05)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_sparsity_rate_predictor_joint_training():
    torch.manual_seed(0)
    x, y = _tiny_problem(c=6, n=128)
    y[:32, 1:] = 0.0  # vary the label count: a quarter of the examples have one label
    body, head, rate = torch.nn.Linear(10, 16), torch.nn.Linear(16, 6), SparsityRatePredictor(16, 6)
    params = [*body.parameters(), *head.parameters(), *rate.parameters()]
    opt = torch.optim.Adam(params, lr=0.03)
    first = None
    for _ in range(80):
        opt.zero_grad()
        h = torch.relu(body(x))
        count_logits = rate(h)
        loss = rate.joint_loss(head(h), count_logits, y)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.6 * first
    with torch.no_grad():
        h = torch.relu(body(x))
        predicted_k = rate(h).argmax(-1)
        r = rate.rate(rate(h))
        true_k = y.sum(-1).long()
        assert float((predicted_k == true_k).float().mean()) > 0.7
        # r = (C - k) / C: r-softmax keeps exactly k entries (1 <= k < C, distinct logits)
        kept = (r_softmax(head(h), r) > 0).sum(-1)
        inner = (predicted_k >= 1) & (predicted_k < 6)
        assert torch.equal(kept[inner], predicted_k[inner])


def test_sparsity_rate_predictor_pieces():
    rate = SparsityRatePredictor(in_features=3, n_classes=4)
    count_logits = torch.tensor([[0.0, 0.0, 5.0, 0.0, 0.0], [9.0, 0, 0, 0, 0], [0, 0, 0, 0, 9.0]])
    torch.testing.assert_close(rate.rate(count_logits), torch.tensor([0.5, 1.0, 0.0]))
    soft = rate.rate(count_logits.requires_grad_(), hard=False)
    soft.sum().backward()
    assert count_logits.grad is not None and count_logits.grad.abs().sum() > 0
    y = torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    torch.testing.assert_close(rate.count_loss(count_logits.detach(), y),
                               F.cross_entropy(count_logits.detach(), torch.tensor([2, 0, 4])))
    assert rate(torch.randn(7, 3)).shape == (7, 5)
    with pytest.raises(ValueError, match="classes"):
        rate.count_loss(count_logits, torch.ones(3, 5))


def test_gradcheck_joint_loss():
    rate = SparsityRatePredictor(in_features=3, n_classes=5).double()
    logits_ = logits(4, 5, seed=20).requires_grad_()
    count_logits = logits(4, 6, seed=21).requires_grad_()
    y = multi_hot(4, 5, seed=22)
    # hard=True: r is detached, the count term alone trains the predictor (the paper's reading)
    assert gradcheck(lambda z, c: rate.joint_loss(z, c, y), (logits_, count_logits))
    # hard=False: the expected count, so Eq. 4 also sends a gradient to the count logits through r
    assert gradcheck(lambda z, c: rate.joint_loss(z, c, y, hard=False), (logits_, count_logits))

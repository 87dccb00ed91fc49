"""``experiments/_shared/stacking.py``: S seeds trained as one stacked network give each seed's own trajectory.

Error model (float64, unit roundoff u = 2^-53 ~ 1.1e-16). Stacking changes no formula, only the
order of some sums: a batched matmul or a reduction over the stacked tensor may block its length-n
sums differently from the single call, which moves each result by at most gamma_n = n u relative to
the sum of the absolute terms (Higham, Thm. 3.1). The largest sums here have n = 64 (a batch of 16
rows x 4 outputs in the loss), so one step's loss and gradients agree to ~64 u ~ 7e-15 relative;
the parameters inherit that relative error through the update (SGD: lr x gradient; Adam: the update
m / sqrt(v) is scale-free, so a relative gradient error of d moves it by <= 2d), and later steps add
theirs, so after T = 6 steps they agree to ~T x 2 x 64 u ~ 1e-13. We allow rtol = atol = 1e-11: 100x
that bound, still ~10^8 times below what a real coupling bug gives (a mean over copies instead of a
sum, one copy's batch or optimizer state leaking into another: differences of 1e-3 or more, which
the last tests show). A copy whose inputs do not change is held to the same tolerance, not to bit
equality: a batched kernel computes each batch entry from its own operands, but BLAS may block an
entry's sums differently with the operands' memory alignment, which other tests' allocations change
(copy 0 moved by 2.8e-17 after test_ssvae.py ran first in the same process).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsenorm import registry
from sparsenorm.experiments._shared.stacking import StackedModels, clip_grad_norm_per_copy

SEEDS = (0, 1, 2)
STEPS, N, BATCH, D, HIDDEN, K = 6, 48, 16, 6, 16, 4
RTOL = ATOL = 1e-11  # see the module docstring


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(D, HIDDEN), nn.Tanh())
        self.head = nn.Linear(HIDDEN, K)

    def scores(self, x):
        return self.head(self.hidden(x))


def _data(seed: int = 7, shift: float = 0.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64) + shift
    y = torch.randint(0, K, (N,), generator=gen)
    return x, y


def _loss(norm_name: str):
    norm = registry.get(norm_name)

    def loss(model: Tiny, x, y):
        probs = norm.train_forward(model.scores(x), dim=-1)
        return (probs - nn.functional.one_hot(y, K).to(probs.dtype)).square().sum()

    return loss


def _model(seed: int) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().double()


def _optimizer(kind: str, params):
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=1e-3)


def _separate(seed, data, loss, kind, clip):
    """One seed alone: the reference trajectory."""
    model, gen = _model(seed), torch.Generator().manual_seed(100 + seed)
    optimizer = _optimizer(kind, model.parameters())
    x, y = data
    losses = []
    for _ in range(STEPS):
        idx = torch.randperm(N, generator=gen)[:BATCH]
        value = loss(model, x[idx], y[idx])
        optimizer.zero_grad()
        value.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        losses.append(value.detach())
    return torch.stack(losses), {k: v.detach() for k, v in model.named_parameters()}


def _stacked(seeds, datas, loss, kind, clip):
    """The same seeds as one stacked network; ``datas[s]`` is copy s's data set."""
    stacked = StackedModels([_model(seed) for seed in seeds])
    gens = [torch.Generator().manual_seed(100 + seed) for seed in seeds]
    optimizer = _optimizer(kind, stacked.parameters())
    losses = []
    for _ in range(STEPS):
        idx = [torch.randperm(N, generator=g)[:BATCH] for g in gens]
        x = torch.stack([d[0][i] for d, i in zip(datas, idx)])
        y = torch.stack([d[1][i] for d, i in zip(datas, idx)])
        values = stacked(loss, x, y)
        optimizer.zero_grad()
        values.sum().backward()
        if clip:
            clip_grad_norm_per_copy(list(stacked.parameters()), clip)
        optimizer.step()
        losses.append(values.detach())
    params = [{k: v[s].detach() for k, v in stacked.params.items()} for s in range(len(seeds))]
    return torch.stack(losses, 1), params


@pytest.mark.parametrize("norm_name,kind,clip", [
    ("sparsemax", "adam", None), ("ev_softmax", "sgd", 0.5), ("softmax", "sgd", None), ("entmax15", "adam", None)])
def test_stacked_seeds_follow_their_separate_trajectories(norm_name, kind, clip):
    loss, data = _loss(norm_name), _data()
    stacked_losses, stacked_params = _stacked(SEEDS, [data] * len(SEEDS), loss, kind, clip)
    for s, seed in enumerate(SEEDS):
        losses, params = _separate(seed, data, loss, kind, clip)
        torch.testing.assert_close(stacked_losses[s], losses, rtol=RTOL, atol=ATOL)
        for name, value in params.items():
            torch.testing.assert_close(stacked_params[s][name], value, rtol=RTOL, atol=ATOL)
    # the seeds did differ (the comparison is not of three copies of one run)
    assert (stacked_losses[0] - stacked_losses[1]).abs().max() > 1e-3


def test_copies_are_independent():
    """Changing copy 1's data changes copy 1's trajectory only; the others' move by rounding at most."""
    loss = _loss("sparsemax")
    base, other = _data(), _data(seed=8, shift=1.0)
    losses_a, params_a = _stacked(SEEDS, [base, base, base], loss, "adam", None)
    losses_b, params_b = _stacked(SEEDS, [base, other, base], loss, "adam", None)
    for s in (0, 2):
        torch.testing.assert_close(losses_a[s], losses_b[s], rtol=RTOL, atol=ATOL)
        for k in params_a[s]:
            torch.testing.assert_close(params_a[s][k], params_b[s][k], rtol=RTOL, atol=ATOL)
    assert (losses_a[1] - losses_b[1]).abs().max() > 1e-3


def test_a_mean_over_copies_would_be_caught():
    """The tolerance is far below what coupling the copies does: averaging the loss over copies (SGD's steps
    shrink S-fold) moves the trajectory by much more than RTOL."""
    loss, data = _loss("softmax"), _data()
    mean_loss = lambda model, x, y: loss(model, x, y) / len(SEEDS)  # noqa: E731
    stacked_losses, _ = _stacked(SEEDS, [data] * len(SEEDS), mean_loss, "sgd", None)
    separate, _ = _separate(SEEDS[0], data, loss, "sgd", None)
    assert ((stacked_losses[0] * len(SEEDS) - separate).abs() / separate.abs()).max() > 1e3 * RTOL


def test_per_copy_clipping_equals_clipping_each_copy_alone():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(3, 5, 4, generator=gen, dtype=torch.float64),
             torch.randn(3, 4, generator=gen, dtype=torch.float64)]
    grads[0][2] *= 1e-3  # copy 2's gradient is small: it must not be scaled
    grads[1][2] *= 1e-3
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    norms = clip_grad_norm_per_copy(params, 1.0)
    for s in range(3):
        alone = [torch.zeros_like(g[s], requires_grad=True) for g in grads]
        for p, g in zip(alone, grads):
            p.grad = g[s].clone()
        norm = torch.nn.utils.clip_grad_norm_(alone, 1.0)
        torch.testing.assert_close(norms[s], norm, rtol=1e-14, atol=0)
        for p, q in zip(params, alone):
            torch.testing.assert_close(p.grad[s], q.grad, rtol=1e-14, atol=0)
    torch.testing.assert_close(params[1].grad[2], grads[1][2], rtol=1e-14, atol=0)  # copy 2 unclipped
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        clip_grad_norm_per_copy([torch.zeros(2, requires_grad=True)], 1.0)


def test_copy_reads_one_seed_back_and_bad_stacks_are_refused():
    models = [_model(seed) for seed in SEEDS]
    stacked = StackedModels(models)
    reader = stacked.copy(1, Tiny().double())
    for (name, value), (_, want) in zip(reader.named_parameters(), models[1].named_parameters()):
        assert torch.equal(value, want), name
    with pytest.raises(IndexError):
        stacked.copy(3, Tiny().double())
    with pytest.raises(ValueError, match="same parameter names"):
        StackedModels([Tiny(), nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="at least one"):
        StackedModels([])

"""Monte-Carlo gradient estimators of the unlabelled M2 term, the rows of the ev-softmax paper's Table 2 that
it copies from Correia et al. (2020) and that sparse marginalisation is compared with.

Each replaces the exact marginal ``Σ_z q(z|x) (-ELBO(x, z))`` of the unlabelled loss by one sample
``z ~ q(·|x)`` (``q`` = softmax of the classifier's scores: one decoder call per example), keeps the
entropy term ``-H(q)`` exact, and differs in how the gradient reaches the classifier:

* ``sfe``: the score-function estimator (REINFORCE) with a moving-average baseline ``b``:
  surrogate ``f(z) + (f(z) - b) log q(z|x)`` (``f`` detached in the second term), ``b`` the
  running mean of ``f`` (momentum :data:`BASELINE_MOMENTUM`).
* ``nvil``: Mnih & Gregor's NVIL: the same with an input-dependent learned baseline ``c(x)``
  (784 -> 100 -> 1, trained by squared error on the learning signal) on top of the running mean,
  and the learning signal divided by its running standard deviation (when above 1).
* ``gumbel`` / ``st_gumbel``: the Gumbel-softmax relaxation (temperature :data:`TEMPERATURE`),
  the relaxed one-hot fed to the encoder and decoder, or (straight-through) the hard one-hot in the
  forward pass with the relaxed gradient.

Evaluation (accuracy, the -ELBO bound) uses the trained softmax classifier exactly as the softmax row.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._shared.mnist import PIXELS
from .model import M2, entropy

BASELINE_MOMENTUM = 0.9
TEMPERATURE = 1.0
NVIL_HIDDEN = 100


def _sample(log_q: Tensor, gen: Optional[torch.Generator]) -> Tensor:
    return torch.multinomial(log_q.detach().exp(), 1, generator=gen).squeeze(-1)


class ScoreFunction(nn.Module):
    """SFE with a moving-average baseline (and, for NVIL, a learned input-dependent one)."""

    def __init__(self, learned_baseline: bool = False) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))
        self.baseline = nn.Sequential(nn.Linear(PIXELS, NVIL_HIDDEN), nn.Tanh(), nn.Linear(NVIL_HIDDEN, 1)) \
            if learned_baseline else None

    def forward(self, model: M2, scores: Tensor, x: Tensor, gen: Optional[torch.Generator],
                entropy_weight: float) -> Tensor:
        log_q = F.log_softmax(scores, -1)
        z = _sample(log_q, gen)
        f = model.neg_elbo(x, z, gen)
        signal = f.detach() - self.mean
        extra = torch.zeros((), device=x.device, dtype=f.dtype)
        if self.baseline is not None:
            learned = self.baseline(x).squeeze(-1)
            extra = (signal - learned).square().mean()  # trains c(x) towards f - b
            signal = (signal - learned.detach()) / self.var.sqrt().clamp_min(1.0)
        with torch.no_grad():  # the running statistics, after this step's signal (no look-ahead)
            batch_mean = f.detach().mean()
            new_mean = torch.where(self.started, BASELINE_MOMENTUM * self.mean + (1 - BASELINE_MOMENTUM) * batch_mean,
                                   batch_mean)
            self.var.copy_(torch.where(self.started, BASELINE_MOMENTUM * self.var
                                       + (1 - BASELINE_MOMENTUM) * (f.detach() - new_mean).var(unbiased=False),
                                       torch.ones_like(self.var)))
            self.mean.copy_(new_mean)
            self.started.fill_(True)
        log_q_z = log_q.gather(-1, z.unsqueeze(-1)).squeeze(-1)
        surrogate = f + signal * log_q_z - entropy_weight * entropy(log_q.exp())
        return surrogate.mean() + extra


class GumbelSoftmax(nn.Module):
    """The Gumbel-softmax relaxation, relaxed or straight-through (hard forward, relaxed backward)."""

    def __init__(self, hard: bool) -> None:
        super().__init__()
        self.hard = hard

    def forward(self, model: M2, scores: Tensor, x: Tensor, gen: Optional[torch.Generator],
                entropy_weight: float) -> Tensor:
        log_q = F.log_softmax(scores, -1)
        uniform = torch.rand(log_q.shape, generator=gen, device=log_q.device, dtype=log_q.dtype)
        gumbel = -torch.log((-torch.log(uniform.clamp(1e-20, 1.0))).clamp_min(1e-20))  # u = 1 must not give log 0
        soft = F.softmax((log_q + gumbel) / TEMPERATURE, -1)
        if self.hard:
            hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
            soft = hard - soft.detach() + soft
        f = model.neg_elbo_onehot(x, soft, gen)
        return (f - entropy_weight * entropy(log_q.exp())).mean()


def make(name: str) -> nn.Module:
    """A fresh estimator (its baselines are trained state) by name."""
    builders = {"sfe": lambda: ScoreFunction(), "nvil": lambda: ScoreFunction(learned_baseline=True),
                "gumbel": lambda: GumbelSoftmax(hard=False), "st_gumbel": lambda: GumbelSoftmax(hard=True)}
    if name not in builders:
        raise ValueError(f"unknown estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    return builders[name]()


ESTIMATORS: Dict[str, str] = {
    "sfe": "score function (REINFORCE), moving-average baseline",
    "nvil": "NVIL: learned input-dependent baseline, variance normalisation",
    "gumbel": f"Gumbel-softmax relaxation (temperature {TEMPERATURE:g})",
    "st_gumbel": f"straight-through Gumbel-softmax (temperature {TEMPERATURE:g})",
}
"""Name -> what it is; one decoder call per unlabelled example each."""
CALLS_PER_EXAMPLE = 1.0

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

Two more rows of Table 2 call the decoder twice per example:

* ``sfe_plus``: SFE with a self-critic baseline (Rennie et al. 2017, as Correia et al.'s SFE+): the
  baseline is ``f(argmax q)``, the cost of the most probable class, computed by a second decoder
  call; independent of the sample, so the gradient stays unbiased.
* ``sum_and_sample``: Liu et al. (2019)'s Rao-Blackwellised estimator with one summed class: the most
  probable class ``z*`` enters exactly, ``q(z*) f(z*)``, and one class ``z ~ q(· | z != z*)`` stands
  for the rest, weighted by ``1 - q(z*)``, its score term with the moving-average baseline ``b``
  and the baseline's exact correction ``b (1 - q(z*))`` (so the baseline adds no bias).

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


class SelfCritic(nn.Module):
    """SFE+: the score function with ``f(argmax q)`` as its baseline (two decoder calls per example)."""

    calls = 2

    def forward(self, model: M2, scores: Tensor, x: Tensor, gen: Optional[torch.Generator],
                entropy_weight: float) -> Tensor:
        log_q = F.log_softmax(scores, -1)
        z = _sample(log_q, gen)
        f = model.neg_elbo(x, z, gen)
        with torch.no_grad():
            baseline = model.neg_elbo(x, log_q.argmax(-1), gen)
        log_q_z = log_q.gather(-1, z.unsqueeze(-1)).squeeze(-1)
        surrogate = f + (f.detach() - baseline) * log_q_z - entropy_weight * entropy(log_q.exp())
        return surrogate.mean()


class SumAndSample(nn.Module):
    """Sum-and-sample with one summed class (the most probable) and one sampled from the rest (two decoder calls)."""

    calls = 2

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))

    def forward(self, model: M2, scores: Tensor, x: Tensor, gen: Optional[torch.Generator],
                entropy_weight: float) -> Tensor:
        log_q = F.log_softmax(scores, -1)
        q = log_q.exp()
        top = log_q.detach().argmax(-1)
        q_top = q.gather(-1, top.unsqueeze(-1)).squeeze(-1)
        rest = log_q.detach().scatter(-1, top.unsqueeze(-1), float("-inf"))  # q restricted to the other classes
        z = _sample(F.log_softmax(rest, -1), gen)
        f_top, f = model.neg_elbo(x, top, gen), model.neg_elbo(x, z, gen)
        b = self.mean.detach().clone()  # this step's baseline (the buffer is updated below)
        log_q_z = log_q.gather(-1, z.unsqueeze(-1)).squeeze(-1)
        weight = (1 - q_top).detach()
        sampled = weight * (f + (f.detach() - b) * log_q_z) + b * (1 - q_top)
        with torch.no_grad():  # the running mean of the sampled class's cost, after this step
            batch_mean = f.detach().mean()
            self.mean.copy_(torch.where(self.started, BASELINE_MOMENTUM * self.mean
                                        + (1 - BASELINE_MOMENTUM) * batch_mean, batch_mean))
            self.started.fill_(True)
        return (q_top * f_top + sampled - entropy_weight * entropy(q)).mean()


def make(name: str) -> nn.Module:
    """A fresh estimator (its baselines are trained state) by name."""
    builders = {"sfe": lambda: ScoreFunction(), "nvil": lambda: ScoreFunction(learned_baseline=True),
                "gumbel": lambda: GumbelSoftmax(hard=False), "st_gumbel": lambda: GumbelSoftmax(hard=True),
                "sfe_plus": lambda: SelfCritic(), "sum_and_sample": lambda: SumAndSample()}
    if name not in builders:
        raise ValueError(f"unknown estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    return builders[name]()


ESTIMATORS: Dict[str, str] = {
    "sfe": "score function (REINFORCE), moving-average baseline",
    "nvil": "NVIL: learned input-dependent baseline, variance normalisation",
    "gumbel": f"Gumbel-softmax relaxation (temperature {TEMPERATURE:g})",
    "st_gumbel": f"straight-through Gumbel-softmax (temperature {TEMPERATURE:g})",
    "sfe_plus": "SFE+: score function with a self-critic baseline f(argmax q) (two decoder calls)",
    "sum_and_sample": "sum-and-sample: the most probable class summed, one other sampled (two decoder calls)",
}
"""Name -> what it is."""
CALLS_PER_EXAMPLE = 1.0
"""Decoder calls per unlabelled example of the one-call estimators (see :func:`calls_per_example`)."""


def calls_per_example(name: str) -> float:
    """Decoder calls per unlabelled example of estimator ``name`` (2 for SFE+ and sum-and-sample, else 1)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    return 2.0 if name in ("sfe_plus", "sum_and_sample") else CALLS_PER_EXAMPLE

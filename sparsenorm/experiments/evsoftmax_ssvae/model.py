"""Kingma et al.'s M2 semi-supervised VAE as in the ev-softmax paper (App. E.2) and the authors' code.

Generative model ``p(x | h, z) p(h) p(z)``: ``z`` one of 10 classes (uniform prior), ``h`` in R^8
(standard Gaussian), ``x`` binary pixels (Bernoulli). Networks (sisl/EvSoftmax ``mnist_ssvae``
``archs.py``):

* classifier ``q(z | x)``: 784 -> 256 -> 256 -> 256 -> 10, ReLU (its scores go to the normalizer);
* encoder ``q(h | x, z)``: [x, onehot(z)] -> 128 -> 128 -> (mean, log std) of a diagonal Gaussian;
* decoder ``p(x | h, z)``: [h, onehot(z)] -> 128 -> 128 -> 784 Bernoulli logits.

(The paper says "one hidden layer of size 128"; the released code has two, which we follow.)

``neg_elbo(x, z)`` is the per-pair bound ``-E_q(h|x,z)[log p(x | h, z)] + KL(q(h | x, z) || N(0, I))``
with one reparameterised sample; ``log p(z)`` is left out (a constant, added back in
:func:`marginal_neg_elbo`). The reconstruction uses ``binary_cross_entropy_with_logits`` (the
authors apply a sigmoid and ``log(p + 1e-8)``: the same objective, less stable).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._shared.mnist import PIXELS
from ...marginalize import MarginalStats, marginalize

CLASSES = 10
LATENT = 8
CLASSIFIER_HIDDEN = 256
VAE_HIDDEN = 128


def _mlp(*sizes: int) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class M2(nn.Module):
    def __init__(self, classes: int = CLASSES, latent: int = LATENT) -> None:
        super().__init__()
        self.classes, self.latent = classes, latent
        self.classifier_features = nn.Sequential(
            _mlp(PIXELS, CLASSIFIER_HIDDEN, CLASSIFIER_HIDDEN, CLASSIFIER_HIDDEN), nn.ReLU())
        self.classifier_head = nn.Linear(CLASSIFIER_HIDDEN, classes)
        self.encoder = _mlp(PIXELS + classes, VAE_HIDDEN, VAE_HIDDEN, 2 * latent)
        self.decoder = _mlp(latent + classes, VAE_HIDDEN, VAE_HIDDEN, PIXELS)

    def scores(self, x: Tensor) -> Tensor:
        """Classifier scores (logits) of q(z | x)."""
        return self.classifier_head(self.classifier_features(x))

    def neg_elbo(self, x: Tensor, z: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
        """``-ELBO(x, z)`` per row (without log p(z)): x (R, 784) binary, z (R,) class indices."""
        return self.neg_elbo_onehot(x, F.one_hot(z, self.classes).to(x.dtype), generator)

    def neg_elbo_onehot(self, x: Tensor, onehot: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
        """:meth:`neg_elbo` for a (possibly relaxed, Gumbel-softmax) one-hot ``z`` of shape (R, classes)."""
        mean, log_std = self.encoder(torch.cat([x, onehot], -1)).chunk(2, -1)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        h = mean + noise * log_std.exp()
        logits = self.decoder(torch.cat([h, onehot], -1))
        reconstruction = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)
        kl = 0.5 * (mean.square() + (2 * log_std).exp() - 1 - 2 * log_std).sum(-1)
        return reconstruction + kl


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy per row with 0 log 0 = 0 (finite gradient at exact zeros)."""
    safe = torch.where(probs > 0, probs, torch.ones_like(probs))
    return -(probs * safe.log()).sum(-1)


def expected_neg_elbo(model: M2, probs: Tensor, x: Tensor,
                      generator: Optional[torch.Generator] = None) -> "tuple[Tensor, MarginalStats]":
    """``Σ_z q(z|x) (-ELBO(x, z))`` per example, the decoder run only on the support of ``probs``."""
    return marginalize(probs, lambda ex, cls: model.neg_elbo(x[ex], cls, generator), return_stats=True)


def marginal_neg_elbo(expected: Tensor, probs: Tensor) -> Tensor:
    """The M2 bound on ``-log p(x)`` for an unlabelled x: ``Σ_z q (-ELBO(x, z)) + KL(q(z|x) || uniform)``."""
    return expected - entropy(probs) + math.log(probs.shape[-1])

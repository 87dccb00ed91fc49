"""The CVAE of the ev-softmax paper's Sec. 4.1 (Appendix E.1) and its objective, the conditional ELBO (Eq. 2).

Prior MLP y -> 30 -> K, posterior MLP (x, y) -> 256 -> K, decoder K -> 256 -> 784 (ReLU; Bernoulli
pixels). The reconstruction term uses a Gumbel-Softmax (Concrete) sample of the posterior. Where a
sparse normalizer's zeros make log q or log p undefined (sparsemax and 1.5-entmax have no
``log_prob``), the KL and the Gumbel logits use the probabilities smoothed as the authors' code does
(github.com/sisl/EvSoftmax, mnist_cvae/train.py): ``(p + 1e-6) / (1 + K 1e-6)``.
"""
from __future__ import annotations

from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._shared.mnist import PIXELS

QUERIES = ("even", "odd")  # query index = digit % 2
LATENT_CLASSES = 10
PRIOR_HIDDEN, POSTERIOR_HIDDEN, DECODER_HIDDEN = 30, 256, 256


class CVAE(nn.Module):
    """Prior p(z | y), posterior q(z | x, y) and decoder p(x | z); the heads output scores."""

    def __init__(self, latent: int = LATENT_CLASSES, queries: int = len(QUERIES)) -> None:
        super().__init__()
        self.prior_hidden = nn.Sequential(nn.Linear(queries, PRIOR_HIDDEN), nn.ReLU())
        self.prior_head = nn.Linear(PRIOR_HIDDEN, latent)
        self.posterior_hidden = nn.Sequential(nn.Linear(PIXELS + queries, POSTERIOR_HIDDEN), nn.ReLU())
        self.posterior_head = nn.Linear(POSTERIOR_HIDDEN, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, DECODER_HIDDEN), nn.ReLU(), nn.Linear(DECODER_HIDDEN, PIXELS))

    def prior_scores(self, y: Tensor) -> Tensor:
        return self.prior_head(self.prior_hidden(y))

    def posterior_features(self, x: Tensor, y: Tensor) -> Tensor:
        return self.posterior_hidden(torch.cat([x, y], dim=-1))

    def posterior_scores(self, x: Tensor, y: Tensor) -> Tensor:
        return self.posterior_head(self.posterior_features(x, y))

    def decode_logits(self, z: Tensor) -> Tensor:
        return self.decoder(z)


def latent_log_probs(norm, scores: Tensor, smoothing: float) -> Tensor:
    """Log of the normalizer's training-time distribution over latent classes.

    ``norm.log_prob`` (computed in log space) where the registry has one (softmax, ev-softmax's
    Eq. 10); otherwise the training probabilities smoothed to ``(p + s) / (1 + K s)``.
    """
    if norm.log_prob is not None:
        return norm.log_prob(scores, dim=-1)
    probs = norm.train_forward(scores, dim=-1)
    k = probs.shape[-1]
    return torch.log((probs + smoothing) / (1 + k * smoothing))


def gumbel_softmax_sample(log_probs: Tensor, temperature: float, noise: Union[torch.Generator, Tensor]) -> Tensor:
    """A Concrete / Gumbel-Softmax relaxed one-hot sample (Jang et al.; Maddison et al.).

    ``noise``: the generator to draw the uniform noise from, or that noise itself (a tensor shaped
    like ``log_probs``, uniform on [0, 1); the stacked training draws it per seed outside ``vmap``)."""
    uniform = noise if isinstance(noise, Tensor) else torch.rand(
        log_probs.shape, generator=noise, device=log_probs.device, dtype=log_probs.dtype)
    gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
    return torch.softmax((log_probs + gumbel) / temperature, dim=-1)


def negative_elbo(model: CVAE, norm, x: Tensor, y: Tensor, *, kl_weight: float, temperature: float,
                  smoothing: float, generator: Union[torch.Generator, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Minus the conditional ELBO of Eq. 2, summed over the batch: (total, reconstruction, KL).

    ``kl_weight`` scales the KL term against the batch-summed reconstruction (1 is the textbook
    ELBO; the authors' code uses 0.01 / batch size). ``generator``: the Gumbel-Softmax sample's noise,
    a generator or the ``(batch, latent)`` uniform draws themselves (see :func:`gumbel_softmax_sample`).
    """
    log_q = latent_log_probs(norm, model.posterior_scores(x, y), smoothing)
    log_p = latent_log_probs(norm, model.prior_scores(y), smoothing)
    z = gumbel_softmax_sample(log_q, temperature, generator)
    reconstruction = F.binary_cross_entropy_with_logits(model.decode_logits(z), x, reduction="sum")
    kl = (log_q.exp() * (log_q - log_p)).sum()
    return reconstruction + kl_weight * kl, reconstruction, kl

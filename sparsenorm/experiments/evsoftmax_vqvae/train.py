"""Training the class-conditional PixelCNN prior over one seed's VQ-VAE codes with a normalizer's registry
loss (teacher forcing over every grid position); the epoch with the lowest validation loss is kept."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np
import torch

from ... import registry
from .._shared.devices import to_device
from .._shared.timing import Stopwatch, progress
from .paper import Settings
from .pixelcnn import GatedPixelCNN
from .vqvae import VQVAE


@dataclass
class SeedModels:
    """What one seed's VQ-VAE gives the priors: code grids (+ labels) per split and the decoder."""

    vqvae: VQVAE
    train_codes: np.ndarray
    train_y: np.ndarray
    val_codes: np.ndarray
    val_y: np.ndarray
    test_codes: np.ndarray
    test_y: np.ndarray
    stats: Dict[str, Any]


def code_rows(prior: GatedPixelCNN, codes: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Features ``(M, hidden)`` and targets ``(M,)`` of every grid position (teacher forcing)."""
    feats = prior.feature_map(codes, y)
    return feats.reshape(-1, feats.shape[-1]), codes.reshape(-1)


def prior_loss(normalizer: registry.Normalizer, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The normalizer's registry loss on ``(M, K)`` code scores and ``(M,)`` true codes (mean over rows).

    At K = 512 the r-/t-softmax loss must not build pairs of codes: with class-index targets the
    registry's Eq. 4 loss takes O(K) per row (:mod:`sparsenorm.losses.rsoftmax`)."""
    return normalizer.single_label_loss(logits, target)


def _loss(normalizer: registry.Normalizer, prior: GatedPixelCNN, codes: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    feats, target = code_rows(prior, codes, y)
    return prior_loss(normalizer, prior.out(feats), target)


@torch.no_grad()
def _mean_loss(normalizer, prior, codes: np.ndarray, y: np.ndarray, device, batch: int = 500) -> float:
    prior.eval()
    total = 0.0
    for i in range(0, len(codes), batch):
        c, t = torch.from_numpy(codes[i:i + batch]).to(device), torch.from_numpy(y[i:i + batch]).to(device)
        total += float(_loss(normalizer, prior, c, t)) * len(c)
    return total / len(codes)


def train_prior(name: str, seed_models: SeedModels, n_classes: int, s: Settings, device: torch.device,
                gen: torch.Generator) -> Tuple[GatedPixelCNN, Dict[str, Any]]:
    """A prior trained with ``name``'s registry loss; the epoch with the lowest validation loss is kept."""
    normalizer = registry.get(name)
    prior = GatedPixelCNN(s.codes, n_classes, s.prior_dim, s.prior_layers).to(device)
    optimizer = torch.optim.Adam(prior.parameters(), lr=s.prior_lr)
    codes, labels = torch.from_numpy(seed_models.train_codes), torch.from_numpy(seed_models.train_y)
    clock, steps, history = Stopwatch(), 0, []
    best, best_state = math.inf, None
    for _ in progress(range(s.prior_epochs), desc=f"prior {name} (epochs)"):
        prior.train()
        order = torch.randperm(len(codes), generator=gen)
        for start in range(0, len(codes), s.prior_batch):
            idx = order[start:start + s.prior_batch]
            loss = _loss(normalizer, prior, to_device(codes[idx], device), to_device(labels[idx], device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if s.max_steps is not None and steps >= s.max_steps:
                break
        val = _mean_loss(normalizer, prior, seed_models.val_codes, seed_models.val_y, device)
        history.append(val)
        if val < best:
            best, best_state = val, copy.deepcopy(prior.state_dict())
        if s.max_steps is not None and steps >= s.max_steps:
            break
    prior.load_state_dict(best_state)
    prior.eval()
    return prior, {"steps": steps, "val_loss_per_epoch": history, "best_epoch": int(np.argmin(history)) + 1,
                   "train_time_s": round(clock.elapsed, 1)}

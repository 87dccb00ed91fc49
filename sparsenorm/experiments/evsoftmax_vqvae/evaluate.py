"""Evaluating a trained prior: its test NLL in both forms, autoregressive sampling from its evaluation form
(exact zeros), and the samples' class accuracy, nonzero codes per step and diversity."""
from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import numpy as np
import torch

from ... import registry
from .._shared.timing import Stopwatch, progress
from . import classifier as clf
from .classifier import SmallResNet
from .paper import Settings
from .pixelcnn import GatedPixelCNN
from .train import SeedModels, code_rows
from .vqvae import VQVAE

GRID_PER_CLASS = 8  # samples per class kept for the sample grid
GRID_CLASSES = 10  # rows of the sample grid (the first classes)
LN2 = math.log(2.0)


def eval_probs(normalizer: registry.Normalizer, prior: GatedPixelCNN, feats: torch.Tensor) -> torch.Tensor:
    """Sampling distribution over the codes from last-layer features ``(M, hidden)``: the evaluation form
    (exact zeros); post-hoc evidential reads the last layer's weights."""
    return normalizer.probs_from_linear(feats, prior.out)


@torch.no_grad()
def test_nll(normalizer: registry.Normalizer, prior: GatedPixelCNN, seed_models: SeedModels,
             device: torch.device, batch: int = 500) -> Dict[str, Any]:
    """Per test code position: is the true code on the sampling support; NLL (bits) of both forms."""
    p_true, log_train = [], []
    for i in range(0, len(seed_models.test_codes), batch):
        codes = torch.from_numpy(seed_models.test_codes[i:i + batch]).to(device)
        y = torch.from_numpy(seed_models.test_y[i:i + batch]).to(device)
        feats, target = code_rows(prior, codes, y)
        p_true.append(eval_probs(normalizer, prior, feats).gather(1, target[:, None]).squeeze(1).cpu())
        logits = prior.out(feats)
        if normalizer.log_prob is not None:
            logp = normalizer.log_prob(logits, dim=-1)
        else:
            logp = normalizer.train_forward(logits, dim=-1).log()
        log_train.append(logp.gather(1, target[:, None]).squeeze(1).cpu())
    p = torch.cat(p_true).double()
    lt = torch.cat(log_train).double()
    on = p > 0
    off = float(1 - on.double().mean())
    nll_eval = float(-(p.log()).mean() / LN2)
    nll_train = float(-lt.mean() / LN2)
    return {
        "off_support": off,
        "nll_bits_eval_form": nll_eval if math.isfinite(nll_eval) else None,
        "nll_bits_train_form": nll_train if math.isfinite(nll_train) else None,
        "nll_bits_on_support": float(-(p[on].log()).mean() / LN2) if on.any() else None,
        # the headline: the NLL of what the prior was trained to fit (finite for softmax, post-hoc's softmax and
        # ev-softmax's Eq. 10; None = infinite, i.e. some true code has probability 0)
        "nll_bits": nll_train if math.isfinite(nll_train) else None,
    }


@torch.no_grad()
def sample_codes(normalizer: registry.Normalizer, prior: GatedPixelCNN, labels: torch.Tensor, grid: Tuple[int, int],
                 gen: torch.Generator, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Autoregressive sampling of code grids for ``labels`` (B,), all in one batch, in raster order.

    Returns the codes ``(B, H, W)`` and the number of nonzero probabilities at every step ``(B, H, W)``.
    The prior is causal in rows, so step (i, j) runs it on rows 0..i only.
    """
    height, width = grid
    codes = torch.zeros(len(labels), height, width, dtype=torch.long, device=device)
    nonzero = torch.zeros(len(labels), height, width, dtype=torch.long)
    labels = labels.to(device)
    for i in range(height):
        for j in range(width):
            feats = prior.feature_map(codes[:, :i + 1], labels)[:, i, j]
            probs = eval_probs(normalizer, prior, feats).float()
            nonzero[:, i, j] = (probs > 0).sum(-1).cpu()
            codes[:, i, j] = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(1).to(device)
    return codes, nonzero


@torch.no_grad()
def decode_all(vqvae: VQVAE, codes: torch.Tensor, device: torch.device, chunk: int = 500) -> torch.Tensor:
    vqvae.eval()
    return torch.cat([vqvae.decode(codes[i:i + chunk].to(device)).cpu() for i in range(0, len(codes), chunk)])


def mean_pairwise_distance(images: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over classes of the mean pairwise RMS pixel distance between images of that class."""
    per_class = []
    for c in labels.unique():
        x = images[labels == c].reshape(int((labels == c).sum()), -1).double()
        if len(x) < 2:
            continue
        d = torch.cdist(x, x) / math.sqrt(x.shape[1])
        per_class.append(float(d.sum() / (len(x) * (len(x) - 1))))
    return float(np.mean(per_class)) if per_class else float("nan")


def evaluate_prior(name: str, prior: GatedPixelCNN, seed_models: SeedModels, classifier: SmallResNet, n_classes: int,
                   s: Settings, device: torch.device, gen: torch.Generator, chunk: int = 500) -> Dict[str, Any]:
    """``s.samples_per_class`` samples per class from ``name``'s evaluation form: their accuracy under the
    classifier, nonzero codes per step, diversity, the test NLL and a sample grid."""
    normalizer = registry.get(name)
    clock = Stopwatch()
    labels = torch.arange(n_classes).repeat_interleave(s.samples_per_class)
    grid = tuple(seed_models.test_codes.shape[1:])
    codes, nonzero = [], []
    for start in progress(range(0, len(labels), chunk), desc=f"sampling {name}"):
        c, nz = sample_codes(normalizer, prior, labels[start:start + chunk], grid, gen, device)
        codes.append(c.cpu())
        nonzero.append(nz)
    codes, nonzero = torch.cat(codes), torch.cat(nonzero)
    sample_time = clock.elapsed
    images = decode_all(seed_models.vqvae.to(device).eval(), codes, device, chunk)
    logits = clf.predict_logits(classifier.to(device), images, device)
    grid_classes = min(n_classes, GRID_CLASSES)
    keep = torch.cat([torch.nonzero(labels == c).flatten()[:GRID_PER_CLASS] for c in range(grid_classes)])
    grid_images = ((images[keep].clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    return {
        "top1": clf.topk_accuracy(logits, labels, 1),
        "top3": clf.topk_accuracy(logits, labels, 3),
        "nonzero_codes": float(nonzero.double().mean()),
        "nonzero_codes_min": int(nonzero.min()),
        "nonzero_codes_max": int(nonzero.max()),
        "distinct_codes_sampled": int(codes.unique().numel()),
        "diversity": mean_pairwise_distance(images, labels),
        "samples": len(labels),
        "sample_time_s": round(sample_time, 1),
        **test_nll(normalizer, prior, seed_models, device),
        "grid": grid_images.reshape(grid_classes, -1, *grid_images.shape[1:]),
    }

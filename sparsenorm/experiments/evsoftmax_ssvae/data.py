"""MNIST for the semi-supervised VAE: labelled / unlabelled split, dynamic binarisation, batches.

The images come from :func:`.._shared.mnist.load_mnist` (50k train / 10k validation / 10k test).
A fixed fraction of the training split (10 %: 5,000 of 50,000) keeps its labels; the rest is
unlabelled. The split is drawn once from ``split_seed`` and is the same for every normalizer and
training seed (the authors' code loads one fixed split from disk). Training images are binarised
afresh every time they are drawn (Bernoulli with the grey level as probability, as the authors'
``transforms.ToTensor()(x).bernoulli()``); the validation and test images are binarised once, with
a fixed generator, so every run is scored on the same binary images.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from ..._text import UserFacingError
from .._shared import provenance
from .._shared.mnist import MNIST, load_mnist

EVAL_BINARISATION_SEED = 12345


@dataclass(frozen=True)
class DataRef:
    """Where the data lives; cheap to send to worker processes (each loads the arrays once)."""

    data_dir: Optional[Path]

    def load(self, fetch: bool = False) -> MNIST:
        """The images, read once per process (``fetch``: download into the cache if missing); a reuse
        records the provenance of the first read again (for this run's ``results.json``)."""
        if self.data_dir not in _LOADED:
            with provenance.capture() as read:
                data = load_mnist(self.data_dir, fetch=fetch)
            _LOADED[self.data_dir] = (data, read)
        else:
            provenance.replay(_LOADED[self.data_dir][1])
        return _LOADED[self.data_dir][0]


_LOADED: Dict[Optional[Path], Tuple[MNIST, List[dict]]] = {}


@dataclass
class SemiSupervisedMNIST:
    """Tensors on one device: grey training images split into labelled / unlabelled, binary val/test."""

    labelled_images: Tensor  # (L, 784) grey levels in [0, 1]
    labelled_labels: Tensor  # (L,)
    unlabelled_images: Tensor  # (U, 784)
    unlabelled_labels: Tensor  # (U,) kept only to report training accuracy; never used for training
    val_images: Tensor  # (V, 784) binary
    val_labels: Tensor
    test_images: Tensor  # (T, 784) binary
    test_labels: Tensor


def split(mnist: MNIST, labelled_fraction: float, split_seed: int, device: torch.device) -> SemiSupervisedMNIST:
    """The labelled / unlabelled split of the training images and the binarised evaluation sets."""
    n = len(mnist.train_labels)
    n_labelled = int(round(labelled_fraction * n))
    if not 1 <= n_labelled < n:
        raise UserFacingError(
            f"labelled fraction {labelled_fraction} of {n} training images leaves {n_labelled} labelled and "
            f"{n - n_labelled} unlabelled; both must be at least 1"
        )
    order = np.random.default_rng(split_seed).permutation(n)
    lab, unl = order[:n_labelled], order[n_labelled:]
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    gen = torch.Generator().manual_seed(EVAL_BINARISATION_SEED)
    val = torch.bernoulli(torch.from_numpy(mnist.val_images), generator=gen)
    test = torch.bernoulli(torch.from_numpy(mnist.test_images), generator=gen)
    return SemiSupervisedMNIST(
        as_t(mnist.train_images[lab]), as_t(mnist.train_labels[lab]),
        as_t(mnist.train_images[unl]), as_t(mnist.train_labels[unl]),
        val.to(device), as_t(mnist.val_labels), test.to(device), as_t(mnist.test_labels),
    )


def binarise(grey: Tensor, generator: torch.Generator) -> Tensor:
    """Dynamic binarisation: each pixel is 1 with probability its grey level."""
    return torch.bernoulli(grey, generator=generator)


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator, device: torch.device) -> Iterator[Tensor]:
    """Index batches over ``range(n)``, reshuffled on every pass, forever (the labelled set is cycled)."""
    while True:
        order = torch.randperm(n, generator=generator).to(device)
        yield from order.split(batch_size)

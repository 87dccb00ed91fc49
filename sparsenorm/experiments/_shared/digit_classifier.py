"""The digit classifier Q that scores generated MNIST images (ev-softmax paper, Appendix E.1).

A small MLP (784 -> 512 -> 256 -> 10, ReLU) trained once on the MNIST training split with Adam and
cached next to the data, keyed by a fingerprint of that split, so every experiment and every
later run reuses the same Q.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .checkpoints import cache_model, load_cached_model
from .devices import seed_everything
from .timing import Stopwatch, progress
from .mnist import MNIST, PIXELS

ARCHITECTURE = "MLP 784-512-256-10 (ReLU), Adam lr 1e-3, batch 128"


class DigitClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(PIXELS, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Digit logits of ``(N, 784)`` images in [0, 1]."""
        return self.net(images.reshape(len(images), PIXELS))

    @torch.no_grad()
    def probs(self, images: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self(images), dim=-1)


@torch.no_grad()
def accuracy(model: DigitClassifier, images: np.ndarray, labels: np.ndarray, device: torch.device) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(labels), 4096):
        x = torch.from_numpy(images[start:start + 4096]).to(device)
        correct += int((model(x).argmax(-1).cpu().numpy() == labels[start:start + 4096]).sum())
    return correct / max(len(labels), 1)


def load_or_train(data: MNIST, store: Path, device: torch.device, *, epochs: int = 3,
                  seed: int = 0) -> Tuple[DigitClassifier, Dict[str, Any]]:
    """Q from ``store`` if cached for this training split, else trained now and cached there.

    Returns the model (in eval mode, on ``device``) and a dict with its test accuracy.
    """
    path = Path(store) / f"digit-classifier-{data.fingerprint()}-e{epochs}.pt"
    model = DigitClassifier()
    info = load_cached_model(path, model, ("test_accuracy", "val_accuracy", "epochs", "train_time_s"),
                             "digit classifier")
    if info is not None:
        return model.to(device).eval(), {**info, "architecture": ARCHITECTURE, "cached": True, "path": str(path)}
    clock = Stopwatch()
    gen = seed_everything(seed)
    model = DigitClassifier().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.from_numpy(data.train_images).to(device)
    labels = torch.from_numpy(data.train_labels).to(device)
    batch = 128
    steps_per_epoch = max(1, len(labels) // batch)
    model.train()
    for _ in progress(range(epochs), desc="digit classifier Q (epochs)"):
        order = torch.randperm(len(labels), generator=gen).to(device)
        for step in range(steps_per_epoch):
            idx = order[step * batch:(step + 1) * batch]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    info = {
        "test_accuracy": accuracy(model, data.test_images, data.test_labels, device),
        "val_accuracy": accuracy(model, data.val_images, data.val_labels, device),
        "epochs": epochs,
        "train_time_s": round(clock.elapsed, 1),
    }
    cached_at = cache_model(path, model, info, "digit classifier")
    return model, {**info, "architecture": ARCHITECTURE, "cached": False, "path": cached_at}

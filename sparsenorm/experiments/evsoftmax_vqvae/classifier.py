"""The classifier that scores generated images (the paper's Wide ResNet, App. E.3, made small).

A small ResNet (a 3x3 stem, then three stages of one basic residual block each, the last two
halving the side; global average pooling; a linear layer) trained on the real training images with
Adam, the epoch with the best validation accuracy kept, and cached next to the data keyed by a
fingerprint of the training split and the settings, as the CVAE's digit classifier is
(:mod:`.._shared.digit_classifier`), so later runs reuse it.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._shared.checkpoints import cache_model, load_cached_model
from .._shared.devices import seed_everything
from .._shared.timing import Stopwatch, progress
from .data import ImageSet


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (nn.Identity() if stride == 1 and c_in == c_out else
                         nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, channels: int, n_classes: int, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 4 * width, 2))
        self.head = nn.Linear(4 * width, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits of images ``(N, C, H, W)`` in [-1, 1]."""
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


@torch.no_grad()
def predict_logits(model: nn.Module, images: np.ndarray | Tensor, device: torch.device, batch: int = 1000) -> Tensor:
    model.eval()
    x = torch.as_tensor(images)
    return torch.cat([model(x[i:i + batch].to(device)).cpu() for i in range(0, len(x), batch)])


def topk_accuracy(logits: Tensor, labels: np.ndarray | Tensor, k: int) -> float:
    """Fraction of rows whose label is among the ``k`` highest logits."""
    labels = torch.as_tensor(labels)
    k = min(k, logits.shape[-1])
    return float((logits.topk(k, dim=-1).indices == labels[:, None]).any(-1).float().mean())


def load_or_train(data: ImageSet, store: Path, device: torch.device, *, epochs: int, width: int,
                  train_subset: int | None = None, seed: int = 0) -> Tuple[SmallResNet, Dict[str, Any]]:
    """The classifier from ``store`` if cached for this data and these settings, else trained now and cached."""
    n_train = len(data.train_y) if train_subset is None else min(train_subset, len(data.train_y))
    architecture = f"ResNet: 3x3 stem + 3 basic blocks ({width}-{2 * width}-{4 * width} channels), Adam 1e-3, batch 128"
    path = Path(store) / f"vqvae-classifier-{data.fingerprint()}-w{width}-e{epochs}-n{n_train}.pt"
    model = SmallResNet(data.train_x.shape[1], data.n_classes, width)
    info = load_cached_model(path, model, ("test_accuracy", "test_top3", "val_accuracy", "epochs", "train_time_s"),
                             "image classifier")
    if info is not None:
        return model.to(device).eval(), {**info, "architecture": architecture, "train_images": n_train,
                                         "cached": True}
    clock = Stopwatch()
    gen = seed_everything(seed)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images, labels = torch.from_numpy(data.train_x[:n_train]), torch.from_numpy(data.train_y[:n_train])
    best, best_state = -1.0, None
    for _ in progress(range(epochs), desc="image classifier (epochs)"):
        model.train()
        order = torch.randperm(n_train, generator=gen)
        for start in range(0, n_train, 128):
            idx = order[start:start + 128]
            x = images[idx].to(device)
            if torch.rand((), generator=gen) < 0.5 and data.train_x.shape[1] == 3:
                x = x.flip(-1)  # horizontal flips for natural images only
            loss = F.cross_entropy(model(x), labels[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        val = topk_accuracy(predict_logits(model, data.val_x, device), data.val_y, 1)
        if val > best:
            best, best_state = val, copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    model.eval()
    test_logits = predict_logits(model, data.test_x, device)
    info = {"test_accuracy": topk_accuracy(test_logits, data.test_y, 1),
            "test_top3": topk_accuracy(test_logits, data.test_y, 3),
            "val_accuracy": best, "epochs": epochs, "train_time_s": round(clock.elapsed, 1)}
    cache_model(path, model, info, "image classifier")
    return model, {**info, "architecture": architecture, "train_images": n_train, "cached": False}

"""Where a run computes, and from which seeds: the device, tensors moved to it, autocast on it, and
the seeding of every random generator an experiment draws from."""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a CPU generator seeded the same way.

    With the same seed, a run on CPU is deterministic (torch's CPU kernels are deterministic for the
    ops the experiments use).
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else must be a valid torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available on this machine; use cpu or auto")
    return dev


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. A CPU tensor bound for CUDA is copied from pinned memory without blocking:
    a plain copy from pageable memory waits for the GPU's queue, a host sync on every training step."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def mixed_precision(device: torch.device):
    """bfloat16 autocast on CUDA, for the forward pass and loss of the transformer experiments
    (translation, fine-tuning); nothing elsewhere, so CPU results stay bit-identical."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()

"""Stage 1: the VQ-VAE (van den Oord et al. 2017) whose code grid the priors model.

The architecture of the ev-softmax paper's App. E.3 (the defaults of ritheshkumar95/pytorch-vqvae):
encoder = two stride-2 4x4 convolutions + 2 residual blocks, so a 28x28 image gives a 7x7 code grid
and a 64x64 one the paper's 16x16; decoder = the mirror image with transposed convolutions and a
tanh (images in [-1, 1]). Quantisation picks the nearest of K codebook vectors; the decoder's
gradient passes to the encoder by the straight-through estimator. Loss = MSE reconstruction +
``||sg[z_e] - e||^2`` (codebook) + ``beta ||z_e - sg[e]||^2`` (commitment), beta = 1 in the paper.

Option ``codebook="ema"``: the codebook follows exponential moving averages of its assigned
encoder outputs instead of the codebook loss (van den Oord et al. 2017, App. A.1). Option
``restart_dead``: after each epoch but the last, codes no training batch of that epoch chose are
moved onto random encoder outputs of the last batch (dead-code restart), or, with ``restart_every`` = n > 0,
every n steps the codes no batch chose in those steps; so a collapsed codebook recovers. Option
``init="kmeans"``: the codebook starts at the k-means centres of the first batch's encoder outputs
instead of uniform(-1/K, 1/K) (which the encoder outputs do not reach, so most codes are never
chosen); the report gives codebook usage and perplexity either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._shared.devices import to_device
from .._shared.timing import Stopwatch, progress


@dataclass(frozen=True)
class VQVAEConfig:
    channels: int = 1
    hidden: int = 128
    codes: int = 512
    beta: float = 1.0
    codebook: str = "loss"  # "loss" (the paper) or "ema"
    ema_decay: float = 0.99
    restart_dead: bool = False
    restart_every: int = 0  # with restart_dead: every this many steps (0: after each epoch but the last)
    init: str = "uniform"  # "uniform" (the paper's code: uniform(-1/K, 1/K)) or "kmeans" (of the first batch)

    def __post_init__(self):
        if self.codebook not in ("loss", "ema"):
            raise ValueError(f"codebook must be 'loss' or 'ema', got {self.codebook!r}")
        if self.init not in ("uniform", "kmeans"):
            raise ValueError(f"init must be 'uniform' or 'kmeans', got {self.init!r}")
        if self.restart_every < 0:
            raise ValueError(f"restart_every must be >= 0, got {self.restart_every}")


class ResBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(dim, dim, 3, 1, 1), nn.BatchNorm2d(dim), nn.ReLU(),
                                   nn.Conv2d(dim, dim, 1), nn.BatchNorm2d(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class VectorQuantizer(nn.Module):
    """Nearest-codebook-vector quantisation of ``(N, D, H, W)`` encoder outputs."""

    def __init__(self, codes: int, dim: int, ema: bool, decay: float) -> None:
        super().__init__()
        self.ema, self.decay = ema, decay
        init = torch.empty(codes, dim).uniform_(-1 / codes, 1 / codes)
        self.register_buffer("usage", torch.zeros(codes))  # training assignments since the last restart
        if ema:
            self.register_buffer("codebook", init)
            self.register_buffer("ema_count", torch.ones(codes))
            self.register_buffer("ema_sum", init.clone())
        else:
            self.codebook = nn.Parameter(init)

    def nearest(self, flat: Tensor) -> Tensor:
        """Index of the nearest codebook vector for each row of ``flat`` (M, D)."""
        book = self.codebook
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ book.t() + book.pow(2).sum(1)
        return dist.argmin(1)

    def forward(self, z_e: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(z_q with straight-through gradient, codes (N, H, W), codebook loss, commitment loss)``."""
        n, d, h, w = z_e.shape
        flat = z_e.permute(0, 2, 3, 1).reshape(-1, d)
        codes = self.nearest(flat.detach())
        quantised = self.codebook[codes]
        if self.training:
            onehot = F.one_hot(codes, len(self.codebook)).to(flat.dtype)
            counts = onehot.sum(0)
            self.usage += counts.detach()
            if self.ema:
                with torch.no_grad():
                    self.ema_count.mul_(self.decay).add_(counts, alpha=1 - self.decay)
                    self.ema_sum.mul_(self.decay).add_(onehot.t() @ flat.detach(), alpha=1 - self.decay)
                    total = self.ema_count.sum()  # Laplace smoothing keeps unused codes finite
                    smoothed = (self.ema_count + 1e-5) / (total + len(self.codebook) * 1e-5) * total
                    self.codebook.copy_(self.ema_sum / smoothed[:, None])
        codebook_loss = F.mse_loss(quantised, flat.detach()) if not self.ema else flat.new_zeros(())
        commitment = F.mse_loss(flat, quantised.detach())
        z_q = flat + (quantised - flat).detach()  # straight-through
        return (z_q.reshape(n, h, w, d).permute(0, 3, 1, 2), codes.reshape(n, h, w), codebook_loss, commitment)

    @torch.no_grad()
    def kmeans_init(self, flat: Tensor, gen: torch.Generator, iterations: int = 10) -> None:
        """Set the codebook to the k-means centres of the encoder outputs ``flat`` (M, D): k-means++ seeding (each
        next centre drawn with probability proportional to the squared distance to the nearest one so far), then
        ``iterations`` Lloyd rounds; a centre left without rows keeps its place."""
        k = len(self.codebook)
        first = int(torch.randint(len(flat), (1,), generator=gen))
        centres = flat.new_empty(k, flat.shape[1])
        centres[0] = flat[first]
        closest = (flat - centres[0]).pow(2).sum(1)
        for i in range(1, k):
            weights = closest.cpu().double()
            pick = int(torch.multinomial(weights / weights.sum(), 1, generator=gen)) if weights.sum() > 0 else \
                int(torch.randint(len(flat), (1,), generator=gen))
            centres[i] = flat[pick]
            closest = torch.minimum(closest, (flat - centres[i]).pow(2).sum(1))
        for _ in range(iterations):
            dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ centres.t() + centres.pow(2).sum(1)
            assign = dist.argmin(1)
            counts = torch.bincount(assign, minlength=k).to(flat.dtype)
            sums = torch.zeros_like(centres).index_add_(0, assign, flat)
            filled = counts > 0
            centres[filled] = sums[filled] / counts[filled, None]
        self.codebook.copy_(centres)
        if self.ema:
            self.ema_count.fill_(1.0)
            self.ema_sum.copy_(centres)

    @torch.no_grad()
    def restart_dead(self, recent: Tensor, min_usage: float, gen: torch.Generator) -> int:
        """Move codes used fewer than ``min_usage`` times onto random rows of ``recent`` (M, D)."""
        dead = (self.usage < min_usage).nonzero().flatten()
        if len(dead) and len(recent):
            pick = torch.randint(len(recent), (len(dead),), generator=gen).to(recent.device)
            self.codebook[dead] = recent[pick]
            if self.ema:
                self.ema_count[dead] = 1.0
                self.ema_sum[dead] = recent[pick]
        self.usage.zero_()
        return len(dead)


class VQVAE(nn.Module):
    def __init__(self, config: VQVAEConfig) -> None:
        super().__init__()
        c, h = config.channels, config.hidden
        self.config = config
        self.encoder = nn.Sequential(nn.Conv2d(c, h, 4, 2, 1), nn.BatchNorm2d(h), nn.ReLU(),
                                     nn.Conv2d(h, h, 4, 2, 1), ResBlock(h), ResBlock(h))
        self.quantizer = VectorQuantizer(config.codes, h, config.codebook == "ema", config.ema_decay)
        self.decoder = nn.Sequential(ResBlock(h), ResBlock(h), nn.ReLU(), nn.ConvTranspose2d(h, h, 4, 2, 1),
                                     nn.BatchNorm2d(h), nn.ReLU(), nn.ConvTranspose2d(h, c, 4, 2, 1), nn.Tanh())

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        z_e = self.encoder(x)
        z_q, codes, codebook_loss, commitment = self.quantizer(z_e)
        recon = self.decoder(z_q)
        mse = F.mse_loss(recon, x)
        loss = mse + codebook_loss + self.config.beta * commitment
        return {"loss": loss, "mse": mse, "codes": codes, "recon": recon, "z_e": z_e}

    @torch.no_grad()
    def encode(self, x: Tensor) -> Tensor:
        """Code grid ``(N, H/4, W/4)`` (int64) of images ``(N, C, H, W)``."""
        return self.quantizer(self.encoder(x))[1]

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """Images ``(N, C, 4 H, 4 W)`` in [-1, 1] from a code grid ``(N, H, W)``."""
        return self.decoder(self.quantizer.codebook[codes].permute(0, 3, 1, 2))


def _batches(n: int, size: int, gen: torch.Generator):
    order = torch.randperm(n, generator=gen)
    for start in range(0, n, size):
        yield order[start:start + size]


@torch.no_grad()
def encode_all(model: VQVAE, images: np.ndarray, device: torch.device, batch: int = 1000) -> np.ndarray:
    model.eval()
    out = [model.encode(torch.from_numpy(images[i:i + batch]).to(device)).cpu() for i in range(0, len(images), batch)]
    return torch.cat(out).numpy()


@torch.no_grad()
def reconstruction_mse(model: VQVAE, images: np.ndarray, device: torch.device, batch: int = 1000) -> float:
    model.eval()
    total = 0.0
    for i in range(0, len(images), batch):
        x = torch.from_numpy(images[i:i + batch]).to(device)
        total += float(F.mse_loss(model(x)["recon"], x, reduction="sum"))
    return total / images.size


def codebook_stats(codes: np.ndarray, n_codes: int) -> Dict[str, float]:
    """Codes used at least once, and the perplexity ``exp(H)`` of the code histogram (K if all equally used)."""
    hist = np.bincount(codes.reshape(-1), minlength=n_codes).astype(np.float64)
    p = hist / hist.sum()
    nz = p[p > 0]
    return {"codes_used": int((hist > 0).sum()), "perplexity": float(np.exp(-(nz * np.log(nz)).sum()))}


def train_vqvae(config: VQVAEConfig, train_x: np.ndarray, val_x: np.ndarray, *, epochs: int, batch: int, lr: float,
                device: torch.device, gen: torch.Generator, max_steps: int | None = None,
                desc: str = "VQ-VAE") -> Tuple[VQVAE, Dict[str, Any]]:
    """Train with Adam; return the model (eval mode) and its training record."""
    clock = Stopwatch()
    model = VQVAE(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps, restarts, history = 0, [], []
    for epoch in progress(range(epochs), desc=f"{desc} (epochs)"):
        model.train()
        for idx in _batches(len(train_x), batch, gen):
            x = to_device(torch.from_numpy(train_x[idx.numpy()]), device)
            if steps == 0 and config.init == "kmeans":
                with torch.no_grad():
                    z_e = model.encoder(x).permute(0, 2, 3, 1).reshape(-1, config.hidden)
                model.quantizer.kmeans_init(z_e, gen)
            result = model(x)
            optimizer.zero_grad(set_to_none=True)
            result["loss"].backward()
            optimizer.step()
            steps += 1
            if config.restart_dead and config.restart_every and steps % config.restart_every == 0:
                recent = result["z_e"].detach().permute(0, 2, 3, 1).reshape(-1, config.hidden)
                restarts.append(model.quantizer.restart_dead(recent, 1.0, gen))  # dead: unused in those steps
            if max_steps is not None and steps >= max_steps:
                break
        if config.restart_dead and not config.restart_every and epoch < epochs - 1:
            recent = result["z_e"].detach().permute(0, 2, 3, 1).reshape(-1, config.hidden)
            restarts.append(model.quantizer.restart_dead(recent, 1.0, gen))  # dead: unused for a whole epoch
        history.append(reconstruction_mse(model, val_x, device))
        if max_steps is not None and steps >= max_steps:
            break
    model.eval()
    return model, {"epochs_run": len(history), "steps": steps, "val_mse_per_epoch": history,
                   "dead_code_restarts": restarts, "train_time_s": round(clock.elapsed, 1)}

"""The VQ-VAE experiment (ev-softmax paper, Sec. 4.3, Table 3, App. E.3) on the shared runner.

prepare: images -> classifier (cached) -> one VQ-VAE per seed (cached in ``OUT/models``) -> code grids.
job (seed, trained prior): a gated PixelCNN prior trained with the registry's loss of its normalizer
(post-hoc evidential shares the softmax prior and is sparsified at sampling from its last layer) ->
test NLL -> N samples per class drawn autoregressively from the evaluation form -> decoded ->
classified (top-1/top-3), K = mean nonzero codes per sampling step, diversity, a sample grid.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ... import registry
from ...losses import rsoftmax as r_losses
from .._shared.common import RunConfig, Stopwatch, cache_dir, progress, seed_everything, to_device
from .._shared.runner import Job, RunOptions
from . import classifier as clf
from .data import DATASETS, ImageSet, load_images
from .pixelcnn import GatedPixelCNN
from .vqvae import VQVAE, VQVAEConfig, codebook_stats, encode_all, reconstruction_mse, train_vqvae

PAPER_NORMALIZERS = ("softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax")
DEFAULT_NORMALIZERS = PAPER_NORMALIZERS + ("r_softmax",)
GRID_PER_CLASS = 8  # samples per class kept for the sample grid
GRID_CLASSES = 10  # rows of the sample grid (the first classes)
LN2 = math.log(2.0)


@dataclass
class Settings:
    seeds: int = 3
    normalizers: Tuple[str, ...] = DEFAULT_NORMALIZERS
    dataset: str = "fashion-mnist"
    image_size: Optional[int] = None
    # Full mode: the paper's K, beta, batch sizes and learning rate for the VQ-VAE; widths and epochs cut so that
    # it runs on CPU (the paper's widths cost ~50 CPU-ms per code grid per prior step: ~14 CPU-hours per epoch-set).
    # stage 1: VQ-VAE (App. E.3: hidden 128, K = 512, beta = 1, Adam 2e-4, batch 128, 100 epochs)
    codes: int = 512
    vq_hidden: int = 64
    vq_epochs: int = 10
    vq_batch: int = 128
    vq_lr: float = 2e-4
    beta: float = 1.0
    codebook: str = "loss"
    restart_dead: bool = False
    vq_train_images: Optional[int] = None  # None: the whole training split
    # stage 2: gated PixelCNN priors (App. E.3: 10 layers, hidden 128, batch 32, 100 epochs, best validation loss)
    prior_dim: int = 64
    prior_layers: int = 6
    prior_epochs: int = 10
    prior_batch: int = 32
    prior_lr: float = 1e-3
    prior_train_grids: Optional[int] = None
    eval_grids: Optional[int] = None  # validation/test grids for the prior's validation loss and test NLL
    # evaluation
    samples_per_class: int = 100
    classifier_width: int = 32
    classifier_epochs: int = 8
    classifier_train_images: Optional[int] = None
    max_steps: Optional[int] = None


QUICK = dict(seeds=1, vq_hidden=32, vq_epochs=2, vq_lr=1e-3, vq_train_images=10_000, prior_dim=32, prior_layers=4,
             prior_epochs=2, prior_batch=64, prior_train_grids=10_000, eval_grids=2_000, samples_per_class=100,
             classifier_width=16, classifier_epochs=2, classifier_train_images=10_000)


def trained_prior(normalizer: str) -> str:
    """The normalizer a prior is trained with: post-hoc evidential reuses the softmax prior."""
    return registry.get(normalizer).for_mode(training=True).name


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


@dataclass
class Context:
    data_name: str
    data_source: str
    class_names: Tuple[str, ...]
    image_shape: Tuple[int, int, int]
    sizes: Dict[str, int]
    classifier: clf.SmallResNet
    classifier_info: Dict[str, Any]
    real_diversity: float
    seeds: Dict[int, SeedModels]
    out: Path


class VQVAEExperiment:
    name = "vqvae"
    description = "VQ-VAE with sparse class-conditional PixelCNN priors (ev-softmax paper, Sec. 4.3, Table 3)"
    paper = "ev-softmax (Chen et al. 2021), Sec. 4.3, Table 3, App. E.3"
    default_normalizers = DEFAULT_NORMALIZERS
    full_runtime = ("Full mode: 3 seeds, VQ-VAE of width 64 and priors of 6 gated layers of width 64 (paper: 128 and "
                    "10 x 128), 10 epochs each (paper: 100) on all 50,000 training images, classifier of width 32 "
                    "trained 8 epochs. Estimated from the measured per-image CPU cost (taken on a heavily shared "
                    "machine, so an upper bound) at about 25 CPU-hours, ~14 h on 2 cores; at the paper's widths a "
                    "prior costs ~7x more per step (50 CPU-ms per grid), which needs a GPU (`--device cuda`).")
    decisive_note = ("Decisive mode: quick mode's model and data sizes with 6 seeds (one VQ-VAE and one prior per "
                     "normalizer each): about 32 min on 2 cores (quick mode measured 313 s per seed plus 45 s of "
                     "preparation). Leaves out: full mode's widths and epochs, and tinyImageNet.")
    quick_note = ("Quick mode: 1 seed; a VQ-VAE of width 32 (paper 128) trained 2 epochs at lr 1e-3 on 10,000 "
                  "images; priors of 4 gated layers of width 32 (paper 10 x 128) trained 2 epochs on 10,000 code "
                  "grids; NLL on 2,000 test grids; a classifier of width 16 trained 2 epochs on 10,000 images; "
                  "100 samples per class as in full mode. Differences of a few points of accuracy are within noise.")
    fingerprint_exclude = ("normalizers",)

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dataset", choices=DATASETS, help="fashion-mnist (default) or mnist; an ImageFolder "
                            "--data-dir (e.g. tinyImageNet) takes precedence")
        parser.add_argument("--image-size", type=int, help="side of the images of an ImageFolder --data-dir "
                            "(default: their own, else 64); a multiple of 4")
        parser.add_argument("--codebook", choices=("loss", "ema"), help="codebook updates: loss (the paper) or ema")
        parser.add_argument("--restart-dead-codes", action="store_true", default=None,
                            help="move codes unused for an epoch onto encoder outputs")
        parser.add_argument("--samples-per-class", type=int, help="generated images per class (default 100)")

    def settings(self, config: RunConfig) -> Settings:
        s = {"quick": lambda: Settings(**QUICK), "decisive": lambda: Settings(**{**QUICK, "seeds": 6}),
             "full": Settings}[config.mode]()
        if config.seeds:
            s = replace(s, seeds=config.seeds)
        if config.epochs:
            s = replace(s, vq_epochs=config.epochs, prior_epochs=config.epochs)
        if config.normalizers:
            s = replace(s, normalizers=tuple(config.normalizers))
        extra = config.extra
        for option, field_name in (("dataset", "dataset"), ("image_size", "image_size"), ("codebook", "codebook"),
                                   ("restart_dead_codes", "restart_dead"), ("samples_per_class", "samples_per_class")):
            if extra.get(option) is not None:
                s = replace(s, **{field_name: extra[option]})
        if s.samples_per_class < 1:
            raise ValueError(f"--samples-per-class must be positive, got {s.samples_per_class}")
        return replace(s, max_steps=config.max_steps)

    def run_options(self, settings: Settings, device: torch.device) -> RunOptions:
        # Jobs are small CPU-bound models: one thread each, as many workers as cores (at most two here).
        return RunOptions(threads=1, workers=max(1, min(2, os.cpu_count() or 1)) if device.type == "cpu" else 1)

    # ------------------------------------------------------------------ prepare

    def prepare(self, settings: Settings, config: RunConfig, device: torch.device) -> Context:
        threads = torch.get_num_threads()
        if device.type == "cpu":
            # One thread, as in the jobs: these models are small, and on a shared machine two threads stall
            # each other (an epoch of the classifier took 13 min instead of ~1 under load 20); it also keeps
            # the cached models' numbers independent of the machine's core count.
            torch.set_num_threads(1)
        try:
            return self._prepare(settings, config, device)
        finally:
            torch.set_num_threads(threads)

    def _prepare(self, settings: Settings, config: RunConfig, device: torch.device) -> Context:
        data = load_images(settings.dataset, config.data_dir, image_size=settings.image_size)
        if data.shape[1] % 4 or data.shape[2] % 4:
            raise ValueError(f"image side {data.shape[1:]} must be a multiple of 4 (two stride-2 convolutions)")
        store = Path(config.data_dir) if config.data_dir is not None and Path(config.data_dir).is_dir() else cache_dir()
        classifier, classifier_info = clf.load_or_train(
            data, store, device, epochs=settings.classifier_epochs, width=settings.classifier_width,
            train_subset=settings.classifier_train_images)
        seeds = {seed: self._seed_models(seed, data, settings, device, classifier, Path(config.out))
                 for seed in range(settings.seeds)}
        n_div = min(len(data.test_y), settings.samples_per_class * data.n_classes)
        real = mean_pairwise_distance(torch.from_numpy(data.test_x[:n_div]), torch.from_numpy(data.test_y[:n_div]))
        return Context(data.name, data.source, data.class_names, data.shape, data.sizes(), classifier.cpu(),
                       classifier_info, real, seeds, Path(config.out))

    def _seed_models(self, seed: int, data: ImageSet, s: Settings, device: torch.device,
                     classifier: clf.SmallResNet, out: Path) -> SeedModels:
        config = VQVAEConfig(channels=data.shape[0], hidden=s.vq_hidden, codes=s.codes, beta=s.beta,
                             codebook=s.codebook, restart_dead=s.restart_dead)
        n_train = len(data.train_y) if s.vq_train_images is None else min(s.vq_train_images, len(data.train_y))
        key = (f"vqvae-{data.fingerprint()}-seed{seed}-h{s.vq_hidden}-k{s.codes}-{s.codebook}"
               f"{'-restart' if s.restart_dead else ''}-e{s.vq_epochs}-lr{s.vq_lr:g}-b{s.vq_batch}-beta{s.beta:g}"
               f"-n{n_train}"
               f"{f'-steps{s.max_steps}' if s.max_steps else ''}.pt")
        path = out / "models" / key
        model = VQVAE(config)
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(saved["state_dict"])
            record = saved["record"]
            model = model.to(device).eval()
        else:
            gen = seed_everything(seed)
            model, record = train_vqvae(config, data.train_x[:n_train], data.val_x[:s.eval_grids], epochs=s.vq_epochs,
                                        batch=s.vq_batch, lr=s.vq_lr, device=device, gen=gen,
                                        max_steps=s.max_steps, desc=f"VQ-VAE seed {seed}")
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"state_dict": {k: v.cpu() for k, v in model.state_dict().items()}, "record": record},
                       path.with_suffix(".part"))
            path.with_suffix(".part").replace(path)
        n_prior = len(data.train_y) if s.prior_train_grids is None else min(s.prior_train_grids, len(data.train_y))
        n_eval = s.eval_grids
        test_x = data.test_x[:n_eval]
        test_codes = encode_all(model, test_x, device)
        recon_logits = clf.predict_logits(classifier, decode_all(model, torch.from_numpy(test_codes), device), device)
        stats = {**record, "train_images": n_train, "test_mse": reconstruction_mse(model, test_x, device),
                 **{f"test_{k}": v for k, v in codebook_stats(test_codes, s.codes).items()},
                 "classifier_top1_on_reconstructions": clf.topk_accuracy(recon_logits, data.test_y[:n_eval], 1),
                 "classifier_top3_on_reconstructions": clf.topk_accuracy(recon_logits, data.test_y[:n_eval], 3),
                 "code_grid": list(test_codes.shape[1:])}
        return SeedModels(model.cpu(), encode_all(model, data.train_x[:n_prior], device), data.train_y[:n_prior],
                          encode_all(model, data.val_x[:n_eval], device), data.val_y[:n_eval], test_codes,
                          data.test_y[:n_eval], stats)

    # ------------------------------------------------------------------ jobs

    def jobs(self, settings: Settings, config: RunConfig) -> List[Job]:
        groups: Dict[str, List[str]] = {}
        for name in settings.normalizers:
            groups.setdefault(trained_prior(name), []).append(name)
        return [Job(key=f"seed{seed}-{prior}", seed=seed, params={"prior": prior, "normalizers": names})
                for seed in range(settings.seeds) for prior, names in groups.items()]

    def run_job(self, job: Job, context: Context, settings: Settings, device: torch.device) -> Dict[str, Any]:
        seed_models = context.seeds[job.seed]
        clock = Stopwatch()
        prior, training = train_prior(job.params["prior"], seed_models, len(context.class_names), settings, device,
                                      torch.Generator().manual_seed(job.seed))
        results = {}
        for name in job.params["normalizers"]:
            gen = torch.Generator().manual_seed(1000 + job.seed)  # the same sampling noise for every normalizer
            metrics = evaluate_prior(name, prior, seed_models, context, settings, device, gen)
            grid_path = context.out / "samples" / f"seed{job.seed}-{name}.npy"
            grid_path.parent.mkdir(parents=True, exist_ok=True)
            np.save(grid_path, metrics.pop("grid"))
            results[name] = {**metrics, "grid_file": str(grid_path.relative_to(context.out))}
        return {"seed": job.seed, "prior": job.params["prior"], "training": training, "normalizers": results,
                "vqvae": seed_models.stats, "time_s": round(clock.elapsed, 1)}

    def aggregate(self, records: List[Dict[str, Any]], settings: Settings) -> Dict[str, Any]:
        from .report import aggregate

        return aggregate(records, settings)

    def claims(self, summary, records, settings):
        from .claims import claims

        return claims(summary, settings)

    def report(self, out, summary, records, settings, context):
        from .report import write_report

        return write_report(out, summary, records, settings, context)


# ---------------------------------------------------------------------- the prior

def _rows(prior: GatedPixelCNN, codes: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Features ``(M, hidden)`` and targets ``(M,)`` of every grid position (teacher forcing)."""
    feats = prior.feature_map(codes, y)
    return feats.reshape(-1, feats.shape[-1]), codes.reshape(-1)


def eq4_single_label_loss(normalizer: registry.Normalizer, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The r-softmax paper's Eq. 4 loss for one class index per row, in O(C) per row.

    With one positive class k (eta = e_k) Eq. 4 is ``(p_k - 1)^2 + sum_{j != k} max(0, 1 - (z_k - z_j))``
    with p the normalizer's output. The registry's ``r_softmax_loss`` computes the general multi-label
    form, which sorts each row's negatives for the pair term: about 3x the time of this form per step of
    64 x 49 rows at K = 512 (it was 26 CPU-seconds per step with the former (C x C) pair matrix). This
    gives the same value (tests/experiments/test_vqvae.py) and gradient.
    """
    p = normalizer.train_forward(logits, dim=-1)
    z_k = logits.gather(1, target[:, None])
    fit = (p.gather(1, target[:, None]).squeeze(1) - 1).pow(2)
    hinge = (1 - (z_k - logits)).clamp_min(0).scatter(1, target[:, None], 0.0)
    return (fit + hinge.sum(1)).mean()


# Registry losses whose single-label case needs an O(C) form at K = 512 (same value, see above).
_SINGLE_LABEL_FAST = {r_losses.r_softmax_loss, r_losses.t_softmax_loss}


def prior_loss(normalizer: registry.Normalizer, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The normalizer's registry loss on ``(M, K)`` code scores and ``(M,)`` true codes (mean over rows)."""
    if getattr(normalizer.single_label_loss, "func", None) in _SINGLE_LABEL_FAST:
        return eq4_single_label_loss(normalizer, logits, target)
    return normalizer.single_label_loss(logits, target)


def _loss(normalizer: registry.Normalizer, prior: GatedPixelCNN, codes: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    feats, target = _rows(prior, codes, y)
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
        feats, target = _rows(prior, codes, y)
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


def evaluate_prior(name: str, prior: GatedPixelCNN, seed_models: SeedModels, context: Context, s: Settings,
                   device: torch.device, gen: torch.Generator, chunk: int = 500) -> Dict[str, Any]:
    normalizer = registry.get(name)
    clock = Stopwatch()
    n_classes = len(context.class_names)
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
    logits = clf.predict_logits(context.classifier.to(device), images, device)
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


EXPERIMENT = VQVAEExperiment()

"""The VQ-VAE experiment (ev-softmax paper, Sec. 4.3, Table 3, App. E.3) on the shared runner.

prepare: images -> classifier (cached) -> one VQ-VAE per seed (cached in ``OUT/models``) -> code grids.
job (seed, trained prior): a gated PixelCNN prior trained with the registry's loss of its normalizer
(post-hoc evidential shares the softmax prior and is sparsified at sampling from its last layer) ->
test NLL -> N samples per class drawn autoregressively from the evaluation form -> decoded ->
classified (top-1/top-3), K = mean nonzero codes per sampling step, diversity, a sample grid.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from ... import registry
from ..._cache import cache_dir
from .._shared.devices import seed_everything
from .._shared.timing import Stopwatch
from .._shared.runner import Experiment, Job, RunConfig, RunOptions
from . import classifier as clf
from .data import DATASETS, ImageSet, load_images
from .evaluate import decode_all, evaluate_prior, mean_pairwise_distance
from .paper import GATE
from .paper import DEFAULT_NORMALIZERS, PAPER, QUICK, Settings
from .train import SeedModels, train_prior
from .vqvae import VQVAE, VQVAEConfig, codebook_stats, encode_all, reconstruction_mse, train_vqvae


def trained_prior(normalizer: str) -> str:
    """The normalizer a prior is trained with: post-hoc evidential reuses the softmax prior."""
    return registry.get(normalizer).for_mode(training=True).name


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


class VQVAEExperiment(Experiment):
    name = "vqvae"
    regime_gate = GATE  # the paper's regime (paper.py): checked on every run, see _shared/regime.py
    description = "VQ-VAE with sparse class-conditional PixelCNN priors (ev-softmax paper, Sec. 4.3, Table 3)"
    paper = PAPER
    default_normalizers = DEFAULT_NORMALIZERS
    full_runtime = ("Full mode: 3 seeds, VQ-VAE of width 64 and priors of 6 gated layers of width 64 (paper: 128 and "
                    "10 x 128), 10 epochs each (paper: 100) on all 50,000 training images, classifier of width 32 "
                    "trained 8 epochs. Estimated from the measured per-image CPU cost (taken on a heavily shared "
                    "machine, so an upper bound) at about 25 CPU-hours, ~14 h on 2 cores; at the paper's widths a "
                    "prior costs ~7x more per step (50 CPU-ms per grid), which needs a GPU (`--device cuda`).")
    decisive_note = ("Decisive mode: quick mode's model and data sizes with 6 seeds (one VQ-VAE and one prior per "
                     "normalizer each): about 32 min on 2 cores (quick mode measured 313 s per seed plus 45 s of "
                     "preparation). Leaves out: full mode's widths and epochs, and tinyImageNet. In every mode the "
                     "codebook starts at the k-means centres of the first batch's encoder outputs and codes unused "
                     "for 20 steps restart on encoder outputs (the paper's code does neither; without them 21-25 of "
                     "the 512 codes were in use, below the regime gate).")
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
        parser.add_argument("--restart-dead-codes", action=argparse.BooleanOptionalAction, default=None,
                            help="move codes unused for --restart-every steps onto encoder outputs (default: on)")
        parser.add_argument("--restart-every", type=int, help="steps between dead-code restarts (default 20; 0: after "
                            "each epoch)")
        parser.add_argument("--codebook-init", choices=("uniform", "kmeans"),
                            help="codebook start: kmeans of the first batch's encoder outputs (default) or uniform "
                                 "(-1/K, 1/K) (the paper's code)")
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
                                   ("restart_dead_codes", "restart_dead"), ("samples_per_class", "samples_per_class"),
                                   ("restart_every", "restart_every"), ("codebook_init", "codebook_init")):
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
                             codebook=s.codebook, restart_dead=s.restart_dead, restart_every=s.restart_every,
                             init=s.codebook_init)
        n_train = len(data.train_y) if s.vq_train_images is None else min(s.vq_train_images, len(data.train_y))
        restart = f"-restart{s.restart_every}" if s.restart_dead else ""
        kmeans = "-kmeans" if s.codebook_init == "kmeans" else ""
        key = (f"vqvae-{data.fingerprint()}-seed{seed}-h{s.vq_hidden}-k{s.codes}-{s.codebook}"
               f"{restart}{kmeans}-e{s.vq_epochs}-lr{s.vq_lr:g}-b{s.vq_batch}-beta{s.beta:g}"
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
        # Every encoding before the model leaves the device: Module.cpu() moves it in place, and the encodings'
        # images go to `device` (written as SeedModels(model.cpu(), encode_all(model, ...)) it failed on CUDA).
        train_codes = encode_all(model, data.train_x[:n_prior], device)
        val_codes = encode_all(model, data.val_x[:n_eval], device)
        return SeedModels(model.cpu(), train_codes, data.train_y[:n_prior], val_codes, data.val_y[:n_eval], test_codes,
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
            metrics = evaluate_prior(name, prior, seed_models, context.classifier, len(context.class_names), settings,
                                     device, gen)
            grid_path = context.out / "samples" / f"seed{job.seed}-{name}.npy"
            grid_path.parent.mkdir(parents=True, exist_ok=True)
            np.save(grid_path, metrics.pop("grid"))
            results[name] = {**metrics, "grid_file": str(grid_path.relative_to(context.out))}
        return {"seed": job.seed, "prior": job.params["prior"], "training": training, "normalizers": results,
                "vqvae": seed_models.stats, "time_s": round(clock.elapsed, 1)}

    def report(self, out, summary, records, settings, context):
        from .report import write_report

        return write_report(out, summary, records, settings, context)


EXPERIMENT = VQVAEExperiment()

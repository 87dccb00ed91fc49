"""The Table 3-style tables and the figures of the VQ-VAE experiment, from the summary over seeds
(:func:`.claims.aggregate`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .._shared.runner import Report
from .paper import PAPER_TABLE3

def _fmt(entry: Dict[str, Any], key: str, scale: float = 1.0, digits: int = 1) -> str:
    mean = entry.get(key)
    if mean is None:
        return "∞"
    std = entry.get(f"{key}_std") or 0.0
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


# ---------------------------------------------------------------------- figures

def _grid_figure(out: Path, records: List[Dict[str, Any]], settings, class_names) -> Optional[Path]:
    plt = headless_pyplot()
    first = {}
    for rec in records:  # the lowest seed's grid per normalizer
        for name, m in rec["normalizers"].items():
            if name not in first or rec["seed"] < first[name][0]:
                first[name] = (rec["seed"], m["grid_file"])
    names = [n for n in settings.normalizers if n in first and (out / first[n][1]).is_file()]
    if not names:
        return None
    grids = {n: np.load(out / first[n][1]) for n in names}
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        g = grids[name]  # (classes, per_class, C, H, W) uint8
        classes, per, c, h, w = g.shape
        tiled = g.transpose(0, 3, 1, 4, 2).reshape(classes * h, per * w, c)
        ax.imshow(tiled.squeeze(-1) if c == 1 else tiled, cmap="gray" if c == 1 else None, vmin=0, vmax=255)
        ax.set_title(f"{name}\n(seed {first[name][0]})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([(i + 0.5) * h for i in range(classes)] if name == names[0] else [])
        if name == names[0]:
            ax.set_yticklabels(list(class_names)[:classes], fontsize=6)
    fig.suptitle("Samples from each prior (rows = classes)", fontsize=10)
    return save_figure(fig, out / "sample_grids.png")


def _k_vs_accuracy_figure(out: Path, summary: Dict[str, Any], settings) -> Path:
    plt = headless_pyplot()
    norms = summary["normalizers"]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, m in norms.items():
        for key, marker in (("top1", "o"), ("top3", "^")):
            ax.errorbar(m["nonzero_codes"], 100 * m[key], xerr=m["nonzero_codes_std"] or 0,
                        yerr=100 * (m[f"{key}_std"] or 0), fmt=marker, capsize=3,
                        color=f"C{list(norms).index(name)}", label=name if key == "top1" else None)
    ax.set_xscale("log")
    ax.set_xlabel(f"K = mean nonzero codes per position during sampling (of {settings.codes})")
    ax.set_ylabel("classifier accuracy on samples (%)  ● top-1  ▲ top-3")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out / "k_vs_accuracy.png")


# ---------------------------------------------------------------------- the report

def _tables(summary: Dict[str, Any], settings) -> Dict[str, List[List[str]]]:
    """Rows of Table 3 (accuracy and K), of the fit to the test codes, and of the VQ-VAE per seed."""
    norms = summary["normalizers"]
    table3 = []
    for name, m in norms.items():
        paper = PAPER_TABLE3.get(name)
        table3.append([name, _fmt(m, "top1", 100), _fmt(m, "top3", 100), _fmt(m, "nonzero_codes"),
                       *(map(str, paper) if paper else ("—", "—", "—"))])
    fit = []
    for name, m in norms.items():
        fit.append([name, _fmt(m, "nll_bits", digits=2), _fmt(m, "nll_bits_eval_form", digits=2),
                    _fmt(m, "off_support", 100), _fmt(m, "nll_bits_on_support", digits=2),
                    _fmt(m, "diversity", digits=3), _fmt(m, "distinct_codes_sampled", digits=0)])
    vq_rows = [[str(seed), f"{v['test_mse']:.4f}", f"{v['test_codes_used']} / {settings.codes}",
                f"{v['test_perplexity']:.1f}", f"{100 * v['classifier_top1_on_reconstructions']:.1f}%",
                _restarts(v.get("dead_code_restarts")), f"{v['train_time_s']:.0f} s"]
               for seed, v in sorted(summary["vqvae_per_seed"].items(), key=lambda kv: int(kv[0]))]
    return {"table3": table3, "fit": fit, "vq_rows": vq_rows}


def _setting_section(summary: Dict[str, Any], settings, context) -> List[str]:
    """The data (and what it substitutes for), the evaluation classifier and the priors."""
    grid = summary["vqvae_per_seed"][min(summary["vqvae_per_seed"])]["code_grid"]
    n_classes = len(context.class_names)
    clf = context.classifier_info
    substituted = (
        f"**Data: {context.data_name}, not the paper's tinyImageNet.** {context.data_source}; "
        f"{context.sizes['train']:,} train / {context.sizes['val']:,} validation / {context.sizes['test']:,} test "
        f"images of shape {'x'.join(map(str, context.image_shape))}, {n_classes} classes. The same VQ-VAE "
        f"(two stride-2 convolutions) gives a {grid[0]}x{grid[1]} code grid (paper: 16x16 on 64x64 images) over "
        f"K = {settings.codes} codes. With {n_classes} classes instead of 200 the report gives top-1/top-3 accuracy "
        f"(paper: top-5/top-10), from {settings.samples_per_class} samples per class (paper: 25); the paper's "
        f"numbers are shown for orientation only, they are not comparable in level."
        if context.data_name in ("Fashion-MNIST", "MNIST") else
        f"Data: the user's {context.data_source}: {context.sizes['train']:,} train / {context.sizes['val']:,} "
        f"validation / {context.sizes['test']:,} test images, {n_classes} classes, a {grid[0]}x{grid[1]} code grid. "
        f"Top-1/top-3 accuracy (paper: top-5/top-10 with 200 classes).")
    return [
        "## Setting", "",
        substituted, "",
        f"Classifier for the evaluation (the paper's Wide ResNet, made small): {clf['architecture']}, trained on "
        f"{clf['train_images']:,} real training images for {clf['epochs']} epoch(s) (best validation epoch kept"
        f"{', loaded from the cache' if clf.get('cached') else ''}): **test accuracy {100 * clf['test_accuracy']:.1f}% "
        f"top-1, {100 * clf['test_top3']:.1f}% top-3** on real test images.", "",
        "Priors: class-conditional gated PixelCNN, one per normalizer, trained with the registry's loss of that "
        "normalizer (softmax: cross-entropy; sparsemax/entmax-1.5: Fenchel-Young losses; ev-softmax: NLL of its "
        "Eq. 10 training form; r-softmax: the r-softmax paper's Eq. 4, computed in its O(K) single-label form), "
        f"{settings.prior_layers} layers of width {settings.prior_dim}, Adam {settings.prior_lr:g}, batch "
        f"{settings.prior_batch}, {settings.prior_epochs} epoch(s), lowest validation loss kept. The same learning "
        "rate for all (the released code used 1e-5 / 1e-6). Post-hoc evidential is the softmax prior, sparsified at "
        "sampling from its last 1x1 layer (Itkina et al.). Sampling draws every code from the evaluation form (exact "
        "zeros), autoregressively over the grid, in batches; every normalizer of a seed gets the same random stream.",
        "",
    ]


def _restarts(counts) -> str:
    """Dead-code restarts in a cell: each restart's count when there are a few, else their total."""
    if not counts:
        return "none"
    return str(counts) if len(counts) <= 5 else f"{sum(counts)} codes in {len(counts)} restarts (first: {counts[:3]})"


def _results_section(summary: Dict[str, Any], settings, context, table3, fit, vq_rows) -> List[str]:
    """Stage 1 (the VQ-VAE), Table 3, and how well each prior fits the test codes."""
    kmeans = (", codebook started at the k-means centres of the first batch" if settings.codebook_init == "kmeans"
              else "")
    restarts = ((f", dead-code restarts every {settings.restart_every} steps" if settings.restart_every
                 else ", dead-code restarts after each epoch") if settings.restart_dead else "")
    return [
        "## Stage 1: the VQ-VAE (trained once per seed, shared by every prior)", "",
        f"Width {settings.vq_hidden}, β = {settings.beta:g}, codebook updates by "
        f"{'the codebook loss (the paper)' if settings.codebook == 'loss' else 'EMA'}"
        f"{kmeans}{restarts}, Adam {settings.vq_lr:g}, "
        f"{settings.vq_epochs} epoch(s). Codes used and perplexity (exp of the entropy of the code histogram) on the "
        "test grids; the last column is the classifier's accuracy on VQ-VAE reconstructions of test images, the "
        "ceiling for samples.", "",
        markdown_table(["seed", "test MSE ([-1,1] pixels)", "codes used", "perplexity", "classifier top-1 on recon.",
                        "dead-code restarts", "train time"], vq_rows), "",
        "## Table 3: accuracy of class-conditional samples and K", "",
        f"Mean ± std over {summary['seeds']} seed(s); {settings.samples_per_class} samples per class per seed. "
        f"K = mean number of nonzero codes (of {settings.codes}) in the sampling distribution over all sampling steps.",
        "",
        markdown_table(["normalizer", "top-1 %", "top-3 %", "K", "paper Acc-5 %*", "paper Acc-10 %*", "paper K*"],
                       table3), "",
        "\\* tinyImageNet, 200 classes, 16x16 grid: a different data set and metric; compare orderings, not levels.",
        "",
        "## How well each prior fits the test codes", "",
        "NLL in bits per code position on the test grids (teacher forcing). *NLL (trained form)*: of the distribution "
        "the prior was trained to fit — softmax, post-hoc's softmax, ev-softmax's Eq. 10 (ε = 1e-6); sparsemax, "
        "entmax-1.5 and r-softmax have no full-support form, so theirs is ∞ as soon as one true code gets "
        "probability 0. *NLL (sampling form)*: of the distribution codes are drawn from. *Off support*: test positions "
        "whose true code has probability 0 under the sampling form. *Diversity*: mean pairwise RMS pixel distance "
        f"between samples of one class (real test images: {context.real_diversity:.3f}).", "",
        markdown_table(["normalizer", "NLL bits (trained form)", "NLL bits (sampling form)", "off support %",
                        "NLL bits on support", "diversity", "distinct codes sampled"], fit), "",
    ]


def write_report(out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings, context) -> Report:
    figures = {"k_vs_accuracy": _k_vs_accuracy_figure(out, summary, settings)}
    grids = _grid_figure(out, records, settings, context.class_names)
    if grids is not None:
        figures["sample_grids"] = grids
    body = (_setting_section(summary, settings, context)
            + _results_section(summary, settings, context, **_tables(summary, settings))
            + ["![K vs accuracy](k_vs_accuracy.png)", ""])
    if grids is not None:
        body += ["![sample grids](sample_grids.png)", ""]
    return Report(body="\n".join(body), figures=figures, headline="k_vs_accuracy")

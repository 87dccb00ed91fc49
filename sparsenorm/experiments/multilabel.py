"""Multi-label classification: the r-softmax paper's Sec. 4.1 (Fig. 2, Table 1) and the sparsemax
paper's multi-label study, with ev-softmax added.

The output layer's support is the predicted label set: a sparse normalizer needs no threshold,
softmax needs a threshold p0 and per-label sigmoids a 0.5 cut. Every method trains the paper's
"simple two-layer network" (Linear-ReLU-Linear, hidden width 128) with Adam at lr 1e-3 and is
scored by F1 on held-out data:

* ``softmax``: cross-entropy to the normalized label vector y/|y|; labels with p >= p0 for
  p0 in {0.05, 0.10, 0.15, 0.20, 0.30}, plus the best p0 (chosen on the selection set).
* ``sparsemax+huber``: sparsemax with its multi-label loss (the registry's; Martins & Astudillo).
* ``sparsemax+hinge``: sparsemax with Laha et al.'s multi-label hinge loss at alpha = 1 (their
  sparsehourglass loss with q -> infinity, where sparsehourglass becomes sparsemax).
* ``sparsehourglass``: sparsehourglass with its multi-label hinge loss (registry default q).
* ``r_softmax``: r-softmax with a per-example sparsity rate r predicted by an extra layer
  (:class:`sparsenorm.losses.SparsityRatePredictor`) and the Eq. 4 loss plus the label-count
  cross-entropy, as in the paper.
* ``ev_softmax``: trained through Eq. 10 with the cross-entropy (KL up to a constant) to y/|y|
  (the registry's multi-label loss); the predicted set is the support of ev-softmax (Eq. 7).
* ``sigmoid``: one logistic output per label (binary cross-entropy), threshold 0.5 (the everyday
  baseline; not a normalizer, so it lives here and not in the registry).

Any other registry normalizer given with ``--normalizers`` is trained with its registry
multi-label loss and predicts its support.

Model selection: on synthetic data the paper's protocol (the best validation F1 over epochs, and
the best p0, chosen on the same validation set); on yeast the epoch and p0 are chosen on 20 % of the
training set held out for validation, and the standard test split is scored at that epoch.
"""
from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import registry
from ._shared import metrics
from ._shared.common import (
    RunConfig, Stopwatch, headless_pyplot, markdown_table, progress, resolve_device,
    save_figure, seed_everything, write_results,
)
from .multilabel_data import (
    CLASS_COUNTS, FIXED_DOCUMENT_LENGTH, MultilabelData, average_label_sweep, document_length_sweep,
    load_real_data, make_synthetic,
)

NAME = "multilabel"
DESCRIPTION = ("Multi-label classification (r-softmax paper Sec. 4.1, Fig. 2 / Table 1): synthetic sweeps and "
               "yeast; softmax+threshold, sigmoid, sparsemax (huber/hinge), sparsehourglass, r-softmax, ev-softmax")
DEFAULT_NORMALIZERS = ["softmax", "sparsemax", "sparsehourglass", "r_softmax", "ev_softmax"]
FULL_RUNTIME = ("about 2 hours on 2 idle CPU cores (3 seeds x 150 epochs x 7 methods on 27 synthetic settings + yeast; "
                "estimated from the measured ~1 s of CPU per epoch for all 7 methods on one synthetic set)")

SOFTMAX_THRESHOLDS = (0.05, 0.10, 0.15, 0.20, 0.30)
SIGMOID_THRESHOLD = 0.5
HIDDEN = 128
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
FULL_EPOCHS = 150
QUICK_EPOCHS = 6  # measured: 10 epochs cost 1,010 CPU-s (2 workers, shared machine); 6 keeps an idle 2-core run near 5 min
FULL_SEEDS = 3
QUICK_SEEDS = 2
YEAST_VALIDATION_FRACTION = 0.2
SPARSEMAX_HINGE_Q = 1e12  # alpha(z) = 1 to float precision: the q -> infinity (sparsemax) limit
APPROX_TOLERANCE = 0.02  # "r-softmax ~ best softmax": within 2 F1 points

# r-softmax paper, Table 1 (F1, VOC / COCO validation sets). The paper has no yeast result; these
# are the real-data numbers to compare rankings with.
PAPER_TABLE1 = {
    "softmax (p0=0.05)": (75.05, 71.38), "softmax (p0=0.1)": (78.87, 72.29),
    "softmax (p0=0.15)": (79.43, 69.22), "softmax (p0=0.2)": (79.07, 64.88),
    "softmax (p0=0.3)": (75.88, 54.76), "sparsemax+huber": (66.84, 52.30),
    "sparsemax+hinge": (71.91, 65.67), "sparsehourglass": (71.35, 64.85), "r_softmax": (77.90, 72.56),
}
METRICS = ("example_f1", "micro_f1", "macro_f1", "mean_set_size", "true_mean_set_size")


# --------------------------------------------------------------------------------------------
# methods


@dataclass(frozen=True)
class Method:
    """One output layer + loss; ``normalizer`` is a registry name (None for the sigmoid baseline)."""

    key: str
    normalizer: Optional[str]
    loss: str

    def variants(self) -> List[str]:
        """Names of the predictions it yields (softmax: one per threshold)."""
        if self.key == "softmax":
            return [softmax_variant(p0) for p0 in SOFTMAX_THRESHOLDS]
        return [self.key]


def softmax_variant(p0: float) -> str:
    return f"softmax (p0={p0:g})"


BEST_SOFTMAX = "softmax (best p0)"


def methods_for(normalizers: Optional[Sequence[str]]) -> List[Method]:
    """The methods to run: the paper's set by default, or those of the named normalizers."""
    names = list(DEFAULT_NORMALIZERS) if normalizers is None else list(normalizers)
    out: List[Method] = []
    for name in names:
        registry.get(name)  # unknown names raise ValueError listing the known ones
        if name == "softmax":
            out.append(Method("softmax", "softmax", "cross-entropy to y/|y|, threshold p0"))
        elif name == "sparsemax":
            out.append(Method("sparsemax+huber", "sparsemax", "sparsemax multi-label loss (Martins & Astudillo)"))
            out.append(Method("sparsemax+hinge", "sparsemax", "Laha et al. multi-label hinge loss, alpha = 1"))
        elif name == "r_softmax":
            out.append(Method("r_softmax", "r_softmax", "Eq. 4 with learned per-example r + label-count CE"))
        else:
            out.append(Method(name, name, f"registry multi-label loss of {name}"))
    if normalizers is None:
        out.append(Method("sigmoid", None, "per-label binary cross-entropy, threshold 0.5"))
    return out


class MultilabelNet(nn.Module):
    """The paper's two-layer network: ``Linear(d, 128) - ReLU - Linear(128, L)``.

    With ``rate_head`` an extra layer on the hidden features predicts the sparsity rate r of
    r-softmax (r-softmax paper, Sec. 4.1).
    """

    def __init__(self, n_features: int, n_labels: int, hidden: int = HIDDEN, rate_head: bool = False):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, n_labels)
        self.rate = None
        if rate_head:
            from ..losses import SparsityRatePredictor

            self.rate = SparsityRatePredictor(hidden, n_labels)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        h = self.hidden(x)
        return h, self.out(h)


def sparsemax_hinge_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Laha et al.'s multi-label hinge loss for sparsemax: their pairwise loss with alpha = 1.

    The sparsehourglass loss scales the target gaps by 1/alpha(z), alpha(z) = (1 + qK) / (|sum z| + qK);
    as q -> infinity alpha -> 1 and sparsehourglass(z) = sparsemax(alpha z) becomes sparsemax, so
    the q -> infinity loss is the sparsemax hinge loss (Laha et al.'s ``sparsegen_lin`` loss with
    lambda = 0). The loss function takes a finite q: ``SPARSEMAX_HINGE_Q`` = 1e12 puts alpha within
    1e-10 of 1 (exactly 1 in float32) for logit sums below 1e3.
    """
    from ..losses import sparsehourglass_multilabel_hinge_loss

    return sparsehourglass_multilabel_hinge_loss(logits, target, q=SPARSEMAX_HINGE_Q)


def training_loss(method: Method, model: MultilabelNet, x: Tensor, y: Tensor) -> Tensor:
    """The method's loss on a batch (``y`` float 0/1)."""
    h, logits = model(x)
    if method.normalizer is None:
        return F.binary_cross_entropy_with_logits(logits, y)
    if method.key == "sparsemax+hinge":
        return sparsemax_hinge_loss(logits, y)
    if method.key == "r_softmax":
        return model.rate.joint_loss(logits, model.rate(h), y)
    return registry.get(method.normalizer).multi_label_loss(logits, y)


@torch.no_grad()
def predict_sets(method: Method, model: MultilabelNet, x: Tensor) -> Dict[str, np.ndarray]:
    """0/1 predicted label sets per variant of the method."""
    h, logits = model(x)
    if method.normalizer is None:
        return {method.key: (torch.sigmoid(logits) >= SIGMOID_THRESHOLD).cpu().numpy()}
    entry = registry.get(method.normalizer)
    if method.key == "softmax":
        probs = entry.forward(logits, dim=-1)
        return {softmax_variant(p0): (probs >= p0).cpu().numpy() for p0 in SOFTMAX_THRESHOLDS}
    if method.key == "r_softmax":
        from ..rsoftmax import r_softmax

        probs = r_softmax(logits, model.rate.rate(model.rate(h)), dim=-1)
    else:
        probs = entry.probs_from_linear(h, model.out)
    return {method.key: (probs > 0).cpu().numpy()}


# --------------------------------------------------------------------------------------------
# training


@dataclass
class Split:
    """Training data, the set that picks the epoch (and p0), and the set that is reported."""

    x_train: Tensor
    y_train: Tensor
    x_select: Tensor
    y_select: np.ndarray
    x_report: Tensor
    y_report: np.ndarray
    same: bool  # selection set is the reported set (the paper's protocol on synthetic data)


def make_split(data: MultilabelData, device: torch.device, hold_out: float = 0.0, seed: int = 0) -> Split:
    """Tensors for training; with ``hold_out`` > 0 a seeded part of the training set selects."""
    x_tr, y_tr = data.x_train, data.y_train
    to = lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)  # noqa: E731
    if hold_out > 0:
        order = np.random.default_rng(seed).permutation(len(x_tr))
        n_sel = max(1, int(round(hold_out * len(x_tr))))
        sel, tr = order[:n_sel], order[n_sel:]
        return Split(to(x_tr[tr]), to(y_tr[tr]), to(x_tr[sel]), y_tr[sel], to(data.x_eval), data.y_eval, False)
    x_eval = to(data.x_eval)
    return Split(to(x_tr), to(y_tr), x_eval, data.y_eval, x_eval, data.y_eval, True)


def train_method(method: Method, split: Split, seed: int, epochs: int, device: torch.device,
                 max_steps: Optional[int] = None) -> Dict[str, Dict]:
    """Train one method; per variant, the reported metrics at the epoch with the best selection F1.

    Each variant's entry holds the metrics (``METRICS``), ``select_f1`` (the selection-set example F1
    at that epoch), ``best_epoch`` (1-based) and ``curve`` (reported example F1 after every epoch).
    """
    gen = seed_everything(seed)
    n_labels = split.y_train.shape[1]
    model = MultilabelNet(split.x_train.shape[1], n_labels, rate_head=method.key == "r_softmax").to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    n = split.x_train.shape[0]
    best: Dict[str, Dict] = {}
    curves: Dict[str, List[float]] = {v: [] for v in method.variants()}
    steps = 0
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(n, generator=gen).to(device)
        for start in range(0, n, BATCH_SIZE):
            batch = order[start:start + BATCH_SIZE]
            loss = training_loss(method, model, split.x_train[batch], split.y_train[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        model.eval()
        select = predict_sets(method, model, split.x_select)
        report = select if split.same else predict_sets(method, model, split.x_report)
        for variant, pred in report.items():
            scores = metrics.multilabel_scores(split.y_report, pred)
            sel_f1 = scores["example_f1"] if split.same else metrics.example_f1(split.y_select, select[variant])
            curves[variant].append(scores["example_f1"])
            if variant not in best or sel_f1 > best[variant]["select_f1"]:
                best[variant] = {**scores, "select_f1": sel_f1, "best_epoch": epoch}
        if max_steps is not None and steps >= max_steps:
            break
    for variant in best:
        best[variant]["curve"] = curves[variant]
    return best


def add_best_softmax(scores: Dict[str, Dict]) -> None:
    """Add the softmax variant whose threshold has the best selection F1 as ``BEST_SOFTMAX``."""
    candidates = [softmax_variant(p0) for p0 in SOFTMAX_THRESHOLDS if softmax_variant(p0) in scores]
    if candidates:
        pick = max(candidates, key=lambda v: scores[v]["select_f1"])
        scores[BEST_SOFTMAX] = {**scores[pick], "chosen": pick}


# --------------------------------------------------------------------------------------------
# the experiment


@dataclass(frozen=True)
class SyntheticSetting:
    n_classes: int
    n_labels: int
    length: int

    def as_dict(self) -> Dict[str, int]:
        return {"n_classes": self.n_classes, "n_labels": self.n_labels, "length": self.length}


def synthetic_settings(quick: bool) -> Tuple[List[SyntheticSetting], Dict[str, List[SyntheticSetting]]]:
    """Unique settings, and the two sweeps per class count (``"labels/L"``, ``"length/L"``) that
    share them (the point labels = L/2, length = 2,000 lies on both)."""
    sweeps: Dict[str, List[SyntheticSetting]] = {}
    for n_classes in CLASS_COUNTS:
        sweeps[f"labels/{n_classes}"] = [SyntheticSetting(n_classes, k, FIXED_DOCUMENT_LENGTH)
                                         for k in average_label_sweep(n_classes, quick)]
        sweeps[f"length/{n_classes}"] = [SyntheticSetting(n_classes, n_classes // 2, length)
                                         for length in document_length_sweep(quick)]
    unique = list(dict.fromkeys(s for group in sweeps.values() for s in group))
    return unique, sweeps


def _summary(records: List[Dict], variant: str, metric: str = "example_f1") -> Tuple[float, float]:
    values = [r["methods"][variant][metric] for r in records if variant in r["methods"]]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values))


def _variants_in(records: List[Dict], methods: List[Method]) -> List[str]:
    names = [v for m in methods for v in m.variants()]
    if any(m.key == "softmax" for m in methods):
        names.insert(names.index(softmax_variant(SOFTMAX_THRESHOLDS[-1])) + 1, BEST_SOFTMAX)
    return [v for v in names if any(v in r["methods"] for r in records)]


def run_job(job: Tuple[str, Optional[SyntheticSetting], int], methods: List[Method], epochs: int, device: str,
            max_steps: Optional[int], real: MultilabelData) -> Tuple[Dict, Dict[str, float]]:
    """Train every method on one data set and seed: ``(record, seconds per method)``."""
    kind, setting, seed = job
    dev = torch.device(device)
    if kind == "synthetic":
        data = make_synthetic(setting.n_classes, setting.n_labels, setting.length, seed=seed)
        split = make_split(data, dev)
        record = {**setting.as_dict(), "seed": seed, "data": data.summary(), "methods": {}}
    else:
        split = make_split(real, dev, hold_out=YEAST_VALIDATION_FRACTION, seed=seed)
        record = {"seed": seed, "methods": {}}
    seconds: Dict[str, float] = {}
    for method in methods:
        started = Stopwatch()
        scores = train_method(method, split, seed, epochs, dev, max_steps)
        seconds[method.key] = started.elapsed
        if kind == "synthetic":  # learning curves are kept (and plotted) for the real data only
            for entry in scores.values():
                entry.pop("curve")
        record["methods"].update(scores)
    return record, seconds


def run(config: RunConfig) -> Path:
    """Train every method on the synthetic sweeps and the real data; write results, figures, report."""
    threads = torch.get_num_threads()
    # A 128-wide MLP is too small to gain from intra-op threads; on a shared 2-core machine two
    # threads fighting for a core made an epoch up to 30x slower than one thread.
    torch.set_num_threads(1)
    try:
        return _run(config)
    finally:
        torch.set_num_threads(threads)


def _run(config: RunConfig) -> Path:
    watch = Stopwatch()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(config.device)
    seeds = config.seeds or (QUICK_SEEDS if config.quick else FULL_SEEDS)
    epochs = config.epochs or (QUICK_EPOCHS if config.quick else FULL_EPOCHS)
    methods = methods_for(config.normalizers)
    settings, sweeps = synthetic_settings(config.quick)
    real = load_real_data(config.data_dir)  # before any training: a failed fetch stops the run at once
    fetch_seconds = watch.elapsed

    jobs = [("synthetic", s, seed) for s in settings for seed in range(seeds)]
    jobs += [("real", None, seed) for seed in range(seeds)]
    workers = int(config.extra.get("workers") or (1 if device.type == "cuda" else min(2, os.cpu_count() or 1)))
    done: Dict[int, Tuple[Dict, Dict[str, float]]] = {}
    args = (methods, epochs, str(device), config.max_steps, real)
    if workers <= 1:
        for i, job in enumerate(progress(jobs, total=len(jobs), desc=f"multilabel jobs ({len(methods)} methods each)")):
            done[i] = run_job(job, *args)
    else:
        # One process per core, one thread each: the runs are independent and seeded, so the
        # results do not depend on which worker ran them.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            futures = {pool.submit(run_job, job, *args): i for i, job in enumerate(jobs)}
            for future in progress(as_completed(futures), total=len(jobs),
                                   desc=f"multilabel jobs ({len(methods)} methods each, {workers} workers)"):
                done[futures[future]] = future.result()
    synthetic_records = [done[i][0] for i, job in enumerate(jobs) if job[0] == "synthetic"]
    real_records = [done[i][0] for i, job in enumerate(jobs) if job[0] == "real"]
    run_seconds: Dict[str, List[float]] = {m.key: [done[i][1][m.key] for i in done] for m in methods}
    for rec in synthetic_records + real_records:
        add_best_softmax(rec["methods"])

    variants = _variants_in(synthetic_records + real_records, methods)
    figures = {
        "labels": plot_sweep(synthetic_records, sweeps, "labels", variants, out / "f1_vs_average_labels.png"),
        "length": plot_sweep(synthetic_records, sweeps, "length", variants, out / "f1_vs_document_length.png"),
        "curves": plot_curves(real_records, variants, real.name, out / f"{real.name}_learning_curves.png"),
    }
    verdicts = compute_verdicts(synthetic_records, real_records, variants, real.name)
    results = {
        "settings": {
            "quick": config.quick, "seeds": seeds, "epochs": epochs, "batch_size": BATCH_SIZE,
            "hidden": HIDDEN, "learning_rate": LEARNING_RATE, "softmax_thresholds": list(SOFTMAX_THRESHOLDS),
            "sigmoid_threshold": SIGMOID_THRESHOLD, "sparsemax_hinge_q": SPARSEMAX_HINGE_Q,
            "max_steps": config.max_steps, "device": str(device),
            "class_counts": list(CLASS_COUNTS),
            "average_label_sweep": {L: average_label_sweep(L, config.quick) for L in CLASS_COUNTS},
            "document_length_sweep": document_length_sweep(config.quick),
        },
        "methods": [{"key": m.key, "normalizer": m.normalizer, "loss": m.loss, "variants": m.variants()} for m in methods],
        "variants": variants,
        "synthetic": synthetic_records,
        "real": {"name": real.name, "split": real.split, "selection": (
            f"epoch and p0 chosen on {YEAST_VALIDATION_FRACTION:.0%} of the training part held out (seeded)"),
            "data": real.summary(), "runs": real_records,
            "summary": {v: {m: _summary(real_records, v, m) for m in METRICS} for v in variants}},
        "verdicts": verdicts,
        "timing": {"data_seconds": fetch_seconds,
                   "seconds_per_run": {k: float(np.mean(v)) if v else None for k, v in run_seconds.items()},
                   "runs": len(jobs) * len(methods), "workers": workers},
        "figures": {k: v.name for k, v in figures.items() if v is not None},
    }
    write_report(out, config, results, real)
    write_results(out, NAME, config, results, watch.elapsed)
    return out


# --------------------------------------------------------------------------------------------
# figures


_COLOURS = {
    BEST_SOFTMAX: "black", "sigmoid": "tab:gray", "sparsemax+huber": "tab:blue", "sparsemax+hinge": "tab:cyan",
    "sparsehourglass": "tab:green", "r_softmax": "tab:red", "ev_softmax": "tab:purple",
}


def _style(variant: str) -> Dict:
    if variant.startswith("softmax (p0="):
        return {"color": "0.6", "linestyle": ":", "linewidth": 1.0, "marker": "."}
    width = 2.2 if variant in ("r_softmax", "ev_softmax", BEST_SOFTMAX) else 1.5
    return {"color": _COLOURS.get(variant), "linewidth": width, "marker": "o", "markersize": 3}


def plot_sweep(records: List[Dict], sweeps: Dict[str, List[SyntheticSetting]], axis: str,
               variants: List[str], path: Path) -> Optional[Path]:
    """Fig. 2-style panel: example F1 against the swept quantity, one subplot per class count."""
    if not records:
        return None
    plt = headless_pyplot()
    fig, axes = plt.subplots(1, len(CLASS_COUNTS), figsize=(4.6 * len(CLASS_COUNTS), 3.8), squeeze=False)
    for ax, n_classes in zip(axes[0], CLASS_COUNTS):
        points = sweeps[f"{axis}/{n_classes}"]
        xs = [p.n_labels if axis == "labels" else p.length for p in points]
        for variant in variants:
            means, stds = [], []
            for p in points:
                recs = [r for r in records if (r["n_classes"], r["n_labels"], r["length"]) == (p.n_classes, p.n_labels, p.length)]
                m, s = _summary(recs, variant)
                means.append(m)
                stds.append(s)
            if all(math.isnan(m) for m in means):
                continue
            ax.errorbar(xs, means, yerr=stds, label=variant, capsize=2, **_style(variant))
        ax.set_title(f"{n_classes} classes")
        ax.set_xlabel("average number of labels" if axis == "labels" else "average document length")
        if axis == "length":
            ax.set_xscale("log")
        ax.set_ylabel("example-based F1 (validation)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    subtitle = ("document length 2,000" if axis == "labels" else "average labels = half the classes")
    fig.suptitle(f"Multi-label F1 on synthetic data ({subtitle}); mean ± std over seeds")
    return save_figure(fig, path)


def plot_curves(records: List[Dict], variants: List[str], name: str, path: Path) -> Optional[Path]:
    """Fig. 3-style learning curves on the real data: reported example F1 after each epoch (mean over seeds)."""
    if not records:
        return None
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in variants:
        curves = [r["methods"][variant]["curve"] for r in records if variant in r["methods"] and variant != BEST_SOFTMAX]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        mean = np.mean([c[:length] for c in curves], axis=0)
        ax.plot(np.arange(1, length + 1), mean, label=variant, **{k: v for k, v in _style(variant).items() if k != "marker"})
    ax.set_xlabel("epoch")
    ax.set_ylabel("example-based F1 (test)")
    ax.set_title(f"{name}: learning curves (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# verdicts and report


def _setting_means(records: List[Dict], variant: str) -> Dict[Tuple[int, int, int], float]:
    keys = sorted({(r["n_classes"], r["n_labels"], r["length"]) for r in records})
    return {k: _summary([r for r in records if (r["n_classes"], r["n_labels"], r["length"]) == k], variant)[0] for k in keys}


def compute_verdicts(synthetic: List[Dict], real: List[Dict], variants: List[str], real_name: str) -> List[Dict]:
    """One verdict per claim, from this run's mean example-F1 (yeast: test; synthetic: per setting)."""
    verdicts: List[Dict] = []
    have = set(variants)
    real_f1 = {v: _summary(real, v)[0] for v in variants}
    synth = {v: _setting_means(synthetic, v) for v in variants}
    n_settings = len(next(iter(synth.values()), {}))

    def wins(a: str, b: str, tolerance: float = 0.0) -> int:
        return sum(1 for k in synth[a] if synth[a][k] > synth[b][k] - tolerance)

    sparse_rivals = [v for v in ("sparsemax+huber", "sparsemax+hinge", "sparsehourglass") if v in have]
    if "r_softmax" in have and sparse_rivals:
        real_ok = all(real_f1["r_softmax"] > real_f1[v] for v in sparse_rivals)
        fractions = {v: wins("r_softmax", v) / n_settings for v in sparse_rivals} if n_settings else {}
        synth_ok = bool(fractions) and all(f >= 2 / 3 for f in fractions.values())
        detail = "; ".join(
            f"{v}: {real_name} {real_f1['r_softmax']:.3f} vs {real_f1[v]:.3f}"
            + (f", synthetic wins {wins('r_softmax', v)}/{n_settings}" if n_settings else "") for v in sparse_rivals)
        verdicts.append({"claim": "r-softmax > sparsemax (huber, hinge) and sparsehourglass",
                         "verdict": _word(real_ok, synth_ok, bool(n_settings)), "detail": detail})
    if "r_softmax" in have and BEST_SOFTMAX in have:
        gap = real_f1["r_softmax"] - real_f1[BEST_SOFTMAX]
        real_ok = gap >= -APPROX_TOLERANCE
        close = wins("r_softmax", BEST_SOFTMAX, APPROX_TOLERANCE) if n_settings else 0
        synth_ok = bool(n_settings) and close / n_settings >= 2 / 3
        verdicts.append({
            "claim": f"r-softmax ≈ softmax with the best threshold (within {APPROX_TOLERANCE:.2f} F1 or better)",
            "verdict": _word(real_ok, synth_ok, bool(n_settings)),
            "detail": (f"{real_name}: r-softmax − best softmax = {gap:+.3f}"
                       + (f"; synthetic: within tolerance or better in {close}/{n_settings} settings, "
                          f"mean gap {np.mean([synth['r_softmax'][k] - synth[BEST_SOFTMAX][k] for k in synth['r_softmax']]):+.3f}"
                          if n_settings else "")),
        })
    if "sparsemax+huber" in have and BEST_SOFTMAX in have:
        rivals = [v for v in (BEST_SOFTMAX, "sigmoid") if v in have]
        gaps = {v: real_f1["sparsemax+huber"] - real_f1[v] for v in rivals}
        real_ok = all(g >= -APPROX_TOLERANCE for g in gaps.values())
        close = {v: wins("sparsemax+huber", v, APPROX_TOLERANCE) for v in rivals} if n_settings else {}
        synth_ok = bool(n_settings) and all(c / n_settings >= 2 / 3 for c in close.values())
        verdicts.append({
            "claim": "sparsemax (its own loss) is competitive with softmax+threshold and logistic (sparsemax paper)",
            "verdict": _word(real_ok, synth_ok, bool(n_settings)),
            "detail": "; ".join(f"vs {v}: {real_name} {g:+.3f}" + (f", synthetic within/better {close[v]}/{n_settings}" if n_settings else "")
                                for v, g in gaps.items()),
        })
    if "ev_softmax" in have:
        ranked = [v for v in variants if not v.startswith("softmax (p0=")]
        order = sorted(ranked, key=lambda v: -real_f1[v])
        rank = order.index("ev_softmax") + 1
        ranks = []
        for k in (next(iter(synth.values())) if n_settings else {}):
            setting_order = sorted(ranked, key=lambda v: -synth[v][k])
            ranks.append(setting_order.index("ev_softmax") + 1)
        neighbours = ", ".join(f"{v} {real_f1[v]:.3f}" for v in order)
        verdicts.append({
            "claim": "where ev-softmax lands (new; neither paper tried it)",
            "verdict": f"rank {rank} of {len(order)} on {real_name}"
                       + (f"; mean rank {np.mean(ranks):.1f} over {len(ranks)} synthetic settings" if ranks else ""),
            "detail": f"{real_name} example F1, best first: {neighbours}",
        })
    return verdicts


def _word(real_ok: bool, synth_ok: bool, have_synth: bool) -> str:
    if not have_synth:
        return "holds on the real data" if real_ok else "does not hold on the real data"
    if real_ok and synth_ok:
        return "reproduced"
    if real_ok or synth_ok:
        return "partly reproduced (" + ("real data only" if real_ok else "synthetic data only") + ")"
    return "not reproduced"


def _paper_column(variant: str, which: int) -> str:
    key = variant if variant in PAPER_TABLE1 else None
    return f"{PAPER_TABLE1[key][which]:.2f}" if key else "—"


def write_report(out: Path, config: RunConfig, results: Dict, real: MultilabelData) -> Path:
    s = results["settings"]
    real_res = results["real"]
    variants = results["variants"]
    lines = [
        "# Multi-label classification: r-softmax paper Sec. 4.1 (and the sparsemax paper's study)",
        "",
        f"Mode: {'quick' if s['quick'] else 'full'}; {s['seeds']} seeds; {s['epochs']} epochs; batch {s['batch_size']}; "
        f"two-layer network (hidden {s['hidden']}), Adam lr {s['learning_rate']:g}; device {s['device']}."
        + (f" Optimisation capped at {s['max_steps']} steps per run." if s["max_steps"] else ""),
        "",
        "Metric: **example-based F1** (per example 2|T∩P|/(|T|+|P|), averaged over examples; scikit-learn's "
        "`average='samples'`) is the headline; micro- and macro-F1 alongside. The r-softmax paper says only "
        "\"F1 score\" and does not say which average; the sparsemax paper reports micro and macro F1. "
        "An empty predicted set with a non-empty true set scores 0.",
        "",
        f"## {real.name}: Table 1-style",
        "",
        f"Data: {real_res['data']['n_train']} train / {real_res['data']['n_eval']} test, "
        f"{real_res['data']['n_features']} features, {real_res['data']['n_labels']} labels; {real_res['split']}; "
        f"{real_res['selection']}. Mean ± std over seeds of the test scores at the selected epoch. "
        "The paper has no yeast result: its Table 1 numbers are for VOC and COCO (pre-trained ResNets), shown "
        "to compare rankings, not values.",
        "",
    ]
    rows = []
    for v in variants:
        summ = real_res["summary"][v]
        chosen = ""
        if v == BEST_SOFTMAX:
            picks = [r["methods"][v].get("chosen", "") for r in real_res["runs"] if v in r["methods"]]
            chosen = " [" + ", ".join(p.replace("softmax (", "").rstrip(")") for p in picks) + "]"
        rows.append([v + chosen] + [
            f"{summ[m][0]:.3f} ± {summ[m][1]:.3f}" for m in ("example_f1", "micro_f1", "macro_f1")
        ] + [f"{summ['mean_set_size'][0]:.2f} (true {summ['true_mean_set_size'][0]:.2f})",
             _paper_column(v, 0), _paper_column(v, 1)])
    lines.append(markdown_table(
        ["method", "example F1", "micro F1", "macro F1", "avg predicted set size", "paper VOC F1", "paper COCO F1"], rows))
    if results["figures"].get("curves"):
        lines += ["", f"![learning curves]({results['figures']['curves']})"]
    synth = results["synthetic"]
    n_examples = synth[0]["data"]["n_train"] + synth[0]["data"]["n_eval"] if synth else 0
    lines += ["", "## Synthetic data: Fig. 2-style", "",
              f"scikit-learn `make_multilabel_classification`, {n_examples:,} examples, 128 features, 80/20 train/validation, "
              "10/20/30 classes, every example with at least one label; features z-scored. (a) average labels swept at "
              f"document length 2,000 ({s['average_label_sweep']}); (b) document length swept ({s['document_length_sweep']}) "
              "with average labels = half the classes. Best validation F1 over epochs, as in the paper (also for p0).", ""]
    for key in ("labels", "length"):
        if results["figures"].get(key):
            lines += [f"![F1 vs {key}]({results['figures'][key]})", ""]
    if synth:
        shown = [v for v in variants if not v.startswith("softmax (p0=")]
        keys = sorted({(r["n_classes"], r["n_labels"], r["length"]) for r in synth})
        table_rows = []
        for k in keys:
            recs = [r for r in synth if (r["n_classes"], r["n_labels"], r["length"]) == k]
            row_vals = [_summary(recs, v)[0] for v in shown]
            best = np.nanmax(row_vals)
            table_rows.append([f"L={k[0]}, labels={k[1]}, length={k[2]}"] + [
                (f"**{x:.3f}**" if x == best else f"{x:.3f}") for x in row_vals])
        lines += ["Mean validation example-F1 per setting (best per row in bold; per-threshold softmax in results.json):", "",
                  markdown_table(["setting"] + shown, table_rows), ""]
    lines += ["## Verdicts (computed from this run)", ""]
    for v in results["verdicts"]:
        lines.append(f"- **{v['claim']}**: {v['verdict']}. {v['detail']}.")
    lines += ["", "## What differs from the papers", "",
              "- Real data: yeast (2,417 × 103, 14 labels) instead of VOC/COCO images with pre-trained ResNets; the "
              "paper's real-data numbers are not comparable in value.",
              "- The paper does not state the sweep values, hidden width, batch size, feature scaling or seeds; ours are "
              f"listed above (hidden {s['hidden']}, batch {s['batch_size']}, z-scored counts).",
              "- Sparsehourglass uses the registry's q; sparsemax+hinge is Laha et al.'s pairwise hinge at alpha = 1 "
              f"(q = {s['sparsemax_hinge_q']:g}).",
              "- r-softmax: the sparsity rate is predicted per example by an extra layer on the hidden features, trained with "
              "the label-count cross-entropy next to Eq. 4 (our reading of the paper's one-sentence description).",
              "- ev-softmax (not in either paper): trained through Eq. 10 with cross-entropy to y/|y|, predicting its support.",
              ]
    if s["quick"]:
        points = len(s["document_length_sweep"])
        lines += [f"- Quick mode: {s['epochs']} epochs instead of 150, {s['seeds']} seeds and {points} points per sweep; "
                  "numbers are indicative only (models are not converged)."]
    t = results["timing"]
    lines += ["", "## Cost", "",
              f"{t['runs']} training runs; data loading {t['data_seconds']:.1f} s; mean seconds per run: "
              + ", ".join(f"{k} {v:.1f}" for k, v in t["seconds_per_run"].items() if v is not None) + ".",
              f"Full mode: {FULL_RUNTIME}.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path

"""Training every method on one data set and seed, with model selection over epochs.

Model selection: on synthetic data the paper's protocol (the best validation F1 over epochs, and the
best p0, chosen on the same validation set); on the real data the epoch and p0 are chosen on a
seeded part of the training set held out for validation, and the test split is scored at that epoch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .._shared import metrics
from .._shared.devices import seed_everything
from .._shared.timing import Stopwatch
from .data import MultilabelData
from .methods import (
    Method, MultilabelNet, RSoftmaxOptions, StackedMultilabelNet, predict,
    softmax_variant, training_loss,
)
from .paper import BATCH_SIZE, BEST_SOFTMAX, LEARNING_RATE, THRESHOLD_MULTIPLES

R_SOFTMAX = "r_softmax"


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


def topk_sets(scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """0/1 sets of the ``counts[i]`` highest-scoring labels per example (the ranking, given the count)."""
    ranks = np.argsort(np.argsort(-scores, axis=1, kind="stable"), axis=1, kind="stable")
    return ranks < np.asarray(counts).reshape(-1, 1)


def _scores(y_true: np.ndarray, sets: np.ndarray, label_scores: np.ndarray,
            counts: Optional[np.ndarray]) -> Dict[str, float]:
    true_counts = y_true.sum(1)
    out = {**metrics.multilabel_scores(y_true, sets),
           "known_count_topk_f1": metrics.example_f1(y_true, topk_sets(label_scores, true_counts))}
    if counts is not None:
        out["count_accuracy"] = float((counts == true_counts).mean())
    return out


def train_method(method: Method, split: Split, seed: int, epochs: int, device: torch.device,
                 max_steps: Optional[int] = None, *, hourglass_q: float = 1.0,
                 rsoftmax: RSoftmaxOptions = RSoftmaxOptions()) -> Dict[str, Dict]:
    """Train one method; per variant, the reported metrics at the epoch with the best selection F1.

    Each variant's entry holds the metrics (example/micro/macro F1, set sizes, the known-count top-k
    F1, r-softmax's count accuracy), ``select_f1`` (the selection-set example F1 at that epoch),
    ``best_epoch`` (1-based) and ``curve`` (reported example F1 after every epoch).
    """
    return train_stacked(method, [split], [seed], epochs, device, max_steps, hourglass_q=hourglass_q,
                         rsoftmax=rsoftmax)[0]


def _stack_splits(splits: Sequence[Split]) -> Tuple[Tensor, Tensor]:
    shapes = {(tuple(sp.x_train.shape), tuple(sp.y_train.shape)) for sp in splits}
    if len(shapes) != 1:
        raise ValueError(f"stacked splits must have equal training shapes, got {sorted(shapes)}")
    return torch.stack([sp.x_train for sp in splits]), torch.stack([sp.y_train for sp in splits])


def train_stacked(method: Method, splits: Sequence[Split], seeds: Sequence[int], epochs: int, device: torch.device,
                  max_steps: Optional[int] = None, *, hourglass_q: float = 1.0,
                  rsoftmax: RSoftmaxOptions = RSoftmaxOptions()) -> List[Dict[str, Dict]]:
    """:func:`train_method` for several (split, seed) pairs at once, one result per pair.

    Network ``s`` is initialised and shuffled from ``seeds[s]`` exactly as it would be alone and is
    trained in a :class:`StackedMultilabelNet` (see there why its trajectory is its own), so the
    results equal separate runs up to float rounding, at a fraction of the per-step overhead.
    The splits must have equal training shapes (e.g. the settings of one synthetic class count).
    """
    if len(splits) != len(seeds):
        raise ValueError(f"one seed per split: got {len(splits)} splits and {len(seeds)} seeds")
    x_train, y_train = _stack_splits(splits)
    n_models, n = x_train.shape[:2]
    generators, nets = [], []
    for seed in seeds:
        generators.append(seed_everything(seed))  # as train_method alone: seed, build the network, shuffle
        nets.append(MultilabelNet(x_train.shape[2], y_train.shape[2], count_head=method.count_head))
    model = StackedMultilabelNet(nets).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    rows = torch.arange(n_models, device=device).unsqueeze(1)
    options = {"hourglass_q": hourglass_q, "rsoftmax": rsoftmax}
    best: List[Dict[str, Dict]] = [{} for _ in splits]
    curves: List[Dict[str, List[float]]] = [{v: [] for v in method.variants()} for _ in splits]
    steps = 0
    for epoch in range(1, epochs + 1):
        model.train()
        orders = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(device)
        for start in range(0, n, BATCH_SIZE):
            batch = orders[:, start:start + BATCH_SIZE]
            loss = training_loss(method, model, x_train[rows, batch], y_train[rows, batch], **options)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        for s, split in enumerate(splits):
            _evaluate(method, model.member(s).eval(), split, epoch, best[s], curves[s], options)
        if max_steps is not None and steps >= max_steps:
            break
    for model_best, model_curves in zip(best, curves):
        for variant in model_best:
            model_best[variant]["curve"] = model_curves[variant]
    return best


def _evaluate(method: Method, model: MultilabelNet, split: Split, epoch: int, best: Dict[str, Dict],
              curves: Dict[str, List[float]], options: Dict) -> None:
    """Score one network after an epoch; keep each variant's entry at its best selection F1 so far."""
    selected = predict(method, model, split.x_select, **options)
    select = selected[0]
    report, label_scores, counts = selected if split.same else predict(method, model, split.x_report, **options)
    for variant, pred in report.items():
        sel_f1 = metrics.example_f1(split.y_select, select[variant])
        scores = _scores(split.y_report, pred, label_scores, counts)
        curves[variant].append(scores["example_f1"])
        if variant not in best or sel_f1 > best[variant]["select_f1"]:
            best[variant] = {**scores, "select_f1": sel_f1, "best_epoch": epoch}


def add_chosen(scores: Dict[str, Dict]) -> None:
    """Add the softmax threshold and the r-softmax count head with the best selection F1.

    As ``BEST_SOFTMAX`` and ``"r_softmax"``; each entry's ``chosen`` names the pick.
    """
    for name, candidates in ((BEST_SOFTMAX, [softmax_variant(m) for m in THRESHOLD_MULTIPLES]),
                             (R_SOFTMAX, [v for v in scores if v.startswith("r_softmax (")])):
        present = [v for v in candidates if v in scores]
        if present:
            pick = max(present, key=lambda v: scores[v]["select_f1"])
            scores[name] = {**scores[pick], "chosen": pick}


def run_datasets(datasets: Sequence[MultilabelData], splits: Sequence[Split], methods: List[Method], seed: int,
                 epochs: int, device: torch.device, max_steps: Optional[int], *, keep_curves: bool,
                 hourglass_q: float, rsoftmax: RSoftmaxOptions) -> List[Dict]:
    """Train every method on each data set with one seed: one record per data set, with each variant's scores.

    The data sets (equal shapes) are trained side by side (:func:`train_stacked`); a record's
    ``seconds`` per method is the stacked training's time divided by the number of data sets.
    """
    records = [{"seed": seed, "data": {"name": d.name, **d.summary()}, "methods": {}, "seconds": {},
                "trained_together": len(datasets)} for d in datasets]
    for method in methods:
        clock = Stopwatch()
        results = train_stacked(method, splits, [seed] * len(splits), epochs, device, max_steps,
                                hourglass_q=hourglass_q, rsoftmax=rsoftmax)
        for record, scores in zip(records, results):
            record["seconds"][method.key] = round(clock.elapsed / len(datasets), 2)
            if not keep_curves:
                for entry in scores.values():
                    entry.pop("curve")
            record["methods"].update(scores)
    for record in records:
        add_chosen(record["methods"])
    return records

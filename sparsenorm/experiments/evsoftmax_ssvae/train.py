"""One training run (a group of normalizers sharing one trained model, one seed): pretraining on the
labelled images, semi-supervised training, model selection on validation, evaluation on test.

Objective per step (the authors' ``train.py``/``marg.py``), a batch of 64 labelled and 64 unlabelled images:

* labelled: ``mean(-ELBO(x, y) + classification loss(scores(x), y))``, the loss being the
  normalizer's own (registry ``single_label_loss``: cross-entropy, sparsemax loss, 1.5-entmax
  loss, the NLL of ev-softmax's Eq. 10, r-softmax's Eq. 4);
* unlabelled: ``mean(Σ_z q(z|x) (-ELBO(x, z)) - H(q(·|x)))`` with ``q`` the normalizer's
  *evaluation* form (registry ``forward``: ev-softmax's Eq. 7), computed by
  :func:`sparsenorm.marginalize.marginalize`, so the decoder runs once per class in each
  example's support;
* total = labelled + (U / L = 9) x unlabelled; Adam (lr 5e-4, weight decay 1e-5).

Pretraining optimises the labelled term alone (the authors' warm start: lr 1e-3, 100 epochs).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ... import registry
from .._shared import common
from . import estimators as mc
from .data import binarise, shuffled_batches, split
from .model import M2, entropy, expected_neg_elbo, marginal_neg_elbo

class Clock:
    """Wall time and this process's CPU time (load-independent with one thread per job) since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> "tuple[float, float]":
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


EVAL_NOISE_SEED = 777  # the Gaussian sample of h when scoring validation/test ELBOs (the same for every run)


@dataclass(frozen=True)
class Settings:
    epochs: int
    seeds: int
    normalizers: Sequence[str]
    pretrain_epochs: int = 100  # labelled only, the authors' warm start
    pretrain_learning_rate: float = 1e-3  # the authors' warm start
    learning_rate: float = 5e-4
    weight_decay: float = 1e-5
    batch_size: int = 64  # labelled and unlabelled each
    labelled_fraction: float = 0.1  # 5,000 of the 50,000 training images
    split_seed: int = 0  # one labelled/unlabelled split for every run
    entropy_weight: float = 1.0
    r: float = 0.8  # r-softmax's sparsity rate: 8 of 10 classes zero, 2 decoder calls per example
    estimators: Sequence[str] = ()  # Monte-Carlo estimators of the unlabelled term (see .estimators), one job each
    steps_per_epoch: Optional[int] = None  # None: one pass over the unlabelled images (704 steps)
    select_on: str = "elbo"  # model selection on validation: lowest marginal -ELBO ("elbo") or "accuracy"
    selection_examples: Optional[int] = None  # validation images scored for selection (None: all)
    eval_batch: int = 2000
    max_steps: Optional[int] = None  # test hook: caps the steps of every epoch (both phases)


def normalizer(name: str, settings: Settings):
    """The registry entry, with r-softmax's rate set to ``settings.r``."""
    entry = registry.get(name)
    return registry.get(name, r=settings.r) if "r" in entry.params else entry


def training_groups(names: Sequence[str], settings: Settings) -> List[List[str]]:
    """Normalizers whose training is identical share one model per seed: the same marginal form
    (``forward``) and labelled loss, e.g. softmax and post-hoc evidential (a softmax-trained model
    sparsified at evaluation)."""
    groups: Dict[Any, List[str]] = {}
    for name in names:
        norm = normalizer(name, settings)
        key = (norm.forward, norm.single_label_loss)
        key = tuple((f.func, tuple(sorted(f.keywords.items()))) if hasattr(f, "func") else f for f in key)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def supervised_loss(model: M2, norm, x: Tensor, y: Tensor, gen: torch.Generator) -> Tensor:
    classification = norm.single_label_loss(model.scores(x), y, reduction="none")
    return (model.neg_elbo(x, y, gen) + classification).mean()


def unsupervised_loss(model: M2, norm, x: Tensor, gen: torch.Generator, entropy_weight: float):
    """The marginalised unlabelled loss, the decoder rows it evaluated, and the rows the authors'
    batch-level skipping would have evaluated (every example for each class used by any example)."""
    probs = norm.forward(model.scores(x), dim=-1)
    expected, stats = expected_neg_elbo(model, probs, x, gen)
    loss = (expected - entropy_weight * entropy(probs)).mean()
    batch_level_rows = int((probs.detach() != 0).any(0).sum()) * x.shape[0]
    return loss, stats.rows, batch_level_rows


ProbsFn = Callable[[Tensor, torch.nn.Linear], Tensor]


@torch.no_grad()
def evaluate(model: M2, probs_fn: ProbsFn, images: Tensor, labels: Tensor, batch: int,
             with_elbo: bool) -> Dict[str, float]:
    """Accuracy (argmax of q), support size per example (mean, std) and, optionally, the marginal -ELBO."""
    model.eval()
    gen = torch.Generator(device=images.device).manual_seed(EVAL_NOISE_SEED)
    correct, supports, elbos = 0, [], []
    for start in range(0, len(labels), batch):
        x, y = images[start:start + batch], labels[start:start + batch]
        probs = probs_fn(model.classifier_features(x), model.classifier_head)
        correct += int((probs.argmax(-1) == y).sum())
        supports.append((probs != 0).sum(-1).double())
        if with_elbo:
            expected, _ = expected_neg_elbo(model, probs, x, gen)
            elbos.append(marginal_neg_elbo(expected, probs).double())
    model.train()
    support = torch.cat(supports)
    out = {"accuracy": correct / len(labels), "support_mean": float(support.mean()),
           "support_std": float(support.std(unbiased=False))}
    if with_elbo:
        out["neg_elbo"] = float(torch.cat(elbos).mean())
    return out


def run_group(names: List[str], seed: int, mnist, settings: Settings, device: torch.device) -> Dict[str, Any]:
    """Train one model for the normalizers ``names`` (one training group) and evaluate it with each; or, when
    ``names`` is one Monte-Carlo estimator of :mod:`.estimators`, a softmax model whose unlabelled term that
    estimator samples (one decoder call per example) instead of marginalising."""
    estimator = mc.make(names[0]) if names[0] in mc.ESTIMATORS else None
    if estimator is not None and len(names) != 1:
        raise ValueError(f"a Monte-Carlo estimator trains alone, got the group {names}")
    norms = {name: registry.get("softmax") if estimator is not None else normalizer(name, settings) for name in names}
    train_norm = norms[names[0]]  # the group shares forward and loss
    data = split(mnist, settings.labelled_fraction, settings.split_seed, device)
    gen = torch.Generator(device=device).manual_seed(seed)  # binarisation and the h samples
    batch_gen = torch.Generator().manual_seed(seed)  # batch order
    model = M2().to(device)
    if estimator is not None:
        estimator = estimator.to(device)
    label = "+".join(names)

    def cap(steps: int) -> int:
        return min(steps, settings.max_steps) if settings.max_steps else steps

    # ---- pretraining on the labelled images only
    labelled = shuffled_batches(len(data.labelled_labels), settings.batch_size, batch_gen, device)
    pretrain_steps = cap(-(-len(data.labelled_labels) // settings.batch_size))
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.pretrain_learning_rate,
                                 weight_decay=settings.weight_decay)
    clock = Clock()
    total = settings.pretrain_epochs * pretrain_steps
    for _ in common.progress(range(total), total=total, desc=f"ssvae {label} seed {seed}: pretraining"):
        idx = next(labelled)
        loss = supervised_loss(model, train_norm, binarise(data.labelled_images[idx], gen),
                               data.labelled_labels[idx], gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    pretrain_seconds, pretrain_cpu_seconds = clock.elapsed()

    # ---- semi-supervised training
    n_unlabelled = len(data.unlabelled_labels)
    ratio = n_unlabelled / len(data.labelled_labels)
    steps = cap(settings.steps_per_epoch or -(-n_unlabelled // settings.batch_size))
    unlabelled = shuffled_batches(n_unlabelled, settings.batch_size, batch_gen, device)
    params = list(model.parameters()) + (list(estimator.parameters()) if estimator is not None else [])
    optimizer = torch.optim.Adam(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    selection_probs: ProbsFn = lambda f, head: train_norm.forward(head(f), dim=-1)  # noqa: E731
    member_probs = {name: norm.probs_from_linear for name, norm in norms.items()}

    curve: Dict[str, List[float]] = {k: [] for k in (
        "epoch", "val_neg_elbo", "epoch_seconds", "epoch_cpu_seconds", "eval_seconds", "eval_cpu_seconds",
        "rows_per_example",
        "batch_level_rows_per_example")}
    member_curves = {name: {"val_accuracy": [], "test_accuracy": []} for name in names}
    best_score, best_state, best_epoch = None, None, 0

    def record(epoch: int) -> None:
        nonlocal best_score, best_state, best_epoch
        clock = Clock()
        n_val = settings.selection_examples or len(data.val_labels)
        val = evaluate(model, selection_probs, data.val_images[:n_val], data.val_labels[:n_val],
                       settings.eval_batch, with_elbo=settings.select_on == "elbo")
        curve["epoch"].append(epoch)
        curve["val_neg_elbo"].append(val.get("neg_elbo"))
        for name in names:
            for split_name, images, labels in (("val", data.val_images, data.val_labels),
                                               ("test", data.test_images, data.test_labels)):
                acc = evaluate(model, member_probs[name], images, labels, settings.eval_batch, with_elbo=False)
                member_curves[name][f"{split_name}_accuracy"].append(acc["accuracy"])
        wall, cpu = clock.elapsed()
        curve["eval_seconds"].append(wall)
        curve["eval_cpu_seconds"].append(cpu)
        score = val["neg_elbo"] if settings.select_on == "elbo" else -val["accuracy"]
        if epoch > 0 and (best_score is None or score < best_score):
            best_score, best_state, best_epoch = score, copy.deepcopy(model.state_dict()), epoch

    record(0)  # after pretraining (shown in the curves; not a candidate for selection)
    total_rows = total_batch_rows = total_examples = 0
    for epoch in range(1, settings.epochs + 1):
        rows = batch_rows = examples = 0
        clock = Clock()
        for _ in common.progress(range(steps), total=steps, desc=f"ssvae {label} seed {seed}: epoch {epoch}"):
            lab, unl = next(labelled), next(unlabelled)
            x_u = binarise(data.unlabelled_images[unl], gen)
            sup = supervised_loss(model, train_norm, binarise(data.labelled_images[lab], gen),
                                  data.labelled_labels[lab], gen)
            if estimator is None:
                unsup, step_rows, step_batch_rows = unsupervised_loss(model, train_norm, x_u, gen,
                                                                      settings.entropy_weight)
            else:  # one sampled class per example: one decoder row each
                unsup = estimator(model, model.scores(x_u), x_u, gen, settings.entropy_weight)
                step_rows = step_batch_rows = len(unl)
            loss = sup + ratio * unsup
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            rows, batch_rows, examples = rows + step_rows, batch_rows + step_batch_rows, examples + len(unl)
        wall, cpu = clock.elapsed()
        curve["epoch_seconds"].append(wall)
        curve["epoch_cpu_seconds"].append(cpu)
        curve["rows_per_example"].append(rows / examples)
        curve["batch_level_rows_per_example"].append(batch_rows / examples)
        total_rows, total_batch_rows, total_examples = (total_rows + rows, total_batch_rows + batch_rows,
                                                        total_examples + examples)
        record(epoch)

    model.load_state_dict(best_state)
    evaluations = {}
    for name in names:
        test = evaluate(model, member_probs[name], data.test_images, data.test_labels, settings.eval_batch,
                        with_elbo=True)
        evaluations[name] = {
            "test_accuracy": test["accuracy"],
            # a Monte-Carlo estimator calls the decoder once per sample, whatever q's support
            "decoder_calls_mean": mc.CALLS_PER_EXAMPLE if estimator is not None else test["support_mean"],
            "decoder_calls_std": 0.0 if estimator is not None else test["support_std"],
            "test_neg_elbo": test["neg_elbo"],
            "val_accuracy": member_curves[name]["val_accuracy"][best_epoch],
            "curve": member_curves[name],
        }
    return {
        "group": names,
        "seed": seed,
        "selected_epoch": best_epoch,
        "steps_per_epoch": steps,
        "pretrain_steps": total,
        "pretrain_seconds": pretrain_seconds,
        "pretrain_cpu_seconds": pretrain_cpu_seconds,
        "epoch_seconds": sum(curve["epoch_seconds"]) / len(curve["epoch_seconds"]),
        "epoch_cpu_seconds": sum(curve["epoch_cpu_seconds"]) / len(curve["epoch_cpu_seconds"]),
        "decoder_rows_per_example": total_rows / total_examples,
        "batch_level_rows_per_example": total_batch_rows / total_examples,
        "curve": curve,
        "evaluations": evaluations,
    }

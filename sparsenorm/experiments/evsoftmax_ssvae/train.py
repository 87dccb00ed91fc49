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
* total = labelled + (U / L = 9) x unlabelled; Adam (lr 5e-4, weight decay 1e-5);
* ``classifier_weight`` (Kingma et al.'s alpha) multiplies the labelled classification loss in the
  semi-supervised phase (1 in the authors' code). The unlabelled term pulls q(z|x) toward whatever
  classes explain the images best under the generative model, with 9x the labelled term's weight;
  with alpha = 1 that pull wins and test accuracy falls below the warm start's (the committed
  decisive run: softmax 94.3 -> 86.6 %). Kingma et al. (2014, Sec. 3.1.2) add the classification
  loss with alpha = 0.1 N for exactly this reason.

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
from .._shared.timing import progress
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
    classifier_weight: float = 1.0  # Kingma et al.'s alpha on the labelled classification loss (semi-supervised phase)
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


def supervised_loss(model: M2, norm, x: Tensor, y: Tensor, gen: torch.Generator, classifier_weight: float = 1.0
                    ) -> Tensor:
    """The labelled term: ``-ELBO(x, y) + classifier_weight x classification loss``, mean over the batch (the two
    parts train disjoint parameters: the encoder/decoder and the classifier)."""
    classification = norm.single_label_loss(model.scores(x), y, reduction="none")
    return (model.neg_elbo(x, y, gen) + classifier_weight * classification).mean()


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


@dataclass
class _Run:
    """What one training run shares between its stages: the data, the model and its generators."""

    names: List[str]
    seed: int
    settings: Settings
    data: Any  # .data.Split
    model: M2
    train_norm: Any  # the registry entry the group trains with
    gen: torch.Generator  # binarisation and the h samples
    labelled: Any  # an endless iterator of labelled batch indices

    @property
    def label(self) -> str:
        return "+".join(self.names)

    def cap(self, steps: int) -> int:
        return min(steps, self.settings.max_steps) if self.settings.max_steps else steps


def _pretrain(run: _Run) -> Dict[str, Any]:
    """The authors' warm start: the labelled term alone, ``pretrain_epochs`` passes over the labelled images."""
    s, data = run.settings, run.data
    steps = run.cap(-(-len(data.labelled_labels) // s.batch_size))
    optimizer = torch.optim.Adam(run.model.parameters(), lr=s.pretrain_learning_rate, weight_decay=s.weight_decay)
    clock = Clock()
    total = s.pretrain_epochs * steps
    for _ in progress(range(total), total=total, desc=f"ssvae {run.label} seed {run.seed}: pretraining"):
        idx = next(run.labelled)
        loss = supervised_loss(run.model, run.train_norm, binarise(data.labelled_images[idx], run.gen),
                               data.labelled_labels[idx], run.gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    seconds, cpu_seconds = clock.elapsed()
    return {"pretrain_steps": total, "pretrain_seconds": seconds, "pretrain_cpu_seconds": cpu_seconds}


class _Selection:
    """Validation after every epoch: the learning curves, and the state with the best validation score
    (lowest marginal -ELBO, or highest accuracy) among epochs >= 1."""

    def __init__(self, run: _Run, member_probs: Dict[str, ProbsFn]):
        self.run, self.member_probs = run, member_probs
        self.curve: Dict[str, List[float]] = {k: [] for k in (
            "epoch", "val_neg_elbo", "epoch_seconds", "epoch_cpu_seconds", "eval_seconds", "eval_cpu_seconds",
            "rows_per_example",
            "batch_level_rows_per_example")}
        self.member_curves = {name: {"val_accuracy": [], "test_accuracy": []} for name in run.names}
        self.best_score, self.best_state, self.best_epoch = None, None, 0

    def record(self, epoch: int) -> None:
        run, s, data = self.run, self.run.settings, self.run.data
        clock = Clock()
        n_val = s.selection_examples or len(data.val_labels)
        selection_probs: ProbsFn = lambda f, head: run.train_norm.forward(head(f), dim=-1)  # noqa: E731
        val = evaluate(run.model, selection_probs, data.val_images[:n_val], data.val_labels[:n_val],
                       s.eval_batch, with_elbo=s.select_on == "elbo")
        self.curve["epoch"].append(epoch)
        self.curve["val_neg_elbo"].append(val.get("neg_elbo"))
        for name in run.names:
            for split_name, images, labels in (("val", data.val_images, data.val_labels),
                                               ("test", data.test_images, data.test_labels)):
                acc = evaluate(run.model, self.member_probs[name], images, labels, s.eval_batch, with_elbo=False)
                self.member_curves[name][f"{split_name}_accuracy"].append(acc["accuracy"])
        wall, cpu = clock.elapsed()
        self.curve["eval_seconds"].append(wall)
        self.curve["eval_cpu_seconds"].append(cpu)
        score = val["neg_elbo"] if s.select_on == "elbo" else -val["accuracy"]
        if epoch > 0 and (self.best_score is None or score < self.best_score):
            self.best_score, self.best_state, self.best_epoch = score, copy.deepcopy(run.model.state_dict()), epoch


def _semi_supervised_epoch(run: _Run, estimator, unlabelled, optimizer, steps: int, epoch: int) -> Dict[str, float]:
    """One epoch of ``steps`` steps of labelled + (U / L) x unlabelled loss; the decoder rows it evaluated
    (marginalised: each example's support; Monte Carlo: one per example) and its wall and CPU time."""
    s, data, model, gen = run.settings, run.data, run.model, run.gen
    ratio = len(data.unlabelled_labels) / len(data.labelled_labels)
    rows = batch_rows = examples = 0
    clock = Clock()
    for _ in progress(range(steps), total=steps, desc=f"ssvae {run.label} seed {run.seed}: epoch {epoch}"):
        lab, unl = next(run.labelled), next(unlabelled)
        x_u = binarise(data.unlabelled_images[unl], gen)
        sup = supervised_loss(model, run.train_norm, binarise(data.labelled_images[lab], gen),
                              data.labelled_labels[lab], gen, s.classifier_weight)
        if estimator is None:
            unsup, step_rows, step_batch_rows = unsupervised_loss(model, run.train_norm, x_u, gen, s.entropy_weight)
        else:  # one sampled class per example: one decoder row each (two for SFE+ and sum-and-sample)
            unsup = estimator(model, model.scores(x_u), x_u, gen, s.entropy_weight)
            step_rows = step_batch_rows = getattr(estimator, "calls", 1) * len(unl)
        loss = sup + ratio * unsup
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        rows, batch_rows, examples = rows + step_rows, batch_rows + step_batch_rows, examples + len(unl)
    wall, cpu = clock.elapsed()
    return {"rows": rows, "batch_rows": batch_rows, "examples": examples, "wall": wall, "cpu": cpu}


def _test_evaluations(run: _Run, selection: _Selection, monte_carlo: bool) -> Dict[str, Dict[str, Any]]:
    """Each member of the group on the test set, with the selected state."""
    s, data = run.settings, run.data
    evaluations = {}
    for name in run.names:
        test = evaluate(run.model, selection.member_probs[name], data.test_images, data.test_labels, s.eval_batch,
                        with_elbo=True)
        evaluations[name] = {
            "test_accuracy": test["accuracy"],
            # a Monte-Carlo estimator calls the decoder once per sample, whatever q's support
            "decoder_calls_mean": mc.calls_per_example(name) if monte_carlo else test["support_mean"],
            "decoder_calls_std": 0.0 if monte_carlo else test["support_std"],
            "test_neg_elbo": test["neg_elbo"],
            "val_accuracy": selection.member_curves[name]["val_accuracy"][selection.best_epoch],
            "curve": selection.member_curves[name],
        }
    return evaluations


def run_group(names: List[str], seed: int, mnist, settings: Settings, device: torch.device) -> Dict[str, Any]:
    """Train one model for the normalizers ``names`` (one training group) and evaluate it with each; or, when
    ``names`` is one Monte-Carlo estimator of :mod:`.estimators`, a softmax model whose unlabelled term that
    estimator samples (one decoder call per example) instead of marginalising."""
    estimator = mc.make(names[0]) if names[0] in mc.ESTIMATORS else None
    if estimator is not None and len(names) != 1:
        raise ValueError(f"a Monte-Carlo estimator trains alone, got the group {names}")
    norms = {name: registry.get("softmax") if estimator is not None else normalizer(name, settings) for name in names}
    data = split(mnist, settings.labelled_fraction, settings.split_seed, device)
    gen = torch.Generator(device=device).manual_seed(seed)  # binarisation and the h samples
    batch_gen = torch.Generator().manual_seed(seed)  # batch order
    model = M2().to(device)
    if estimator is not None:
        estimator = estimator.to(device)
    labelled = shuffled_batches(len(data.labelled_labels), settings.batch_size, batch_gen, device)
    # the group shares forward and loss: it trains with its first member's
    run = _Run(names, seed, settings, data, model, norms[names[0]], gen, labelled)
    pretraining = _pretrain(run)

    n_unlabelled = len(data.unlabelled_labels)
    steps = run.cap(settings.steps_per_epoch or -(-n_unlabelled // settings.batch_size))
    unlabelled = shuffled_batches(n_unlabelled, settings.batch_size, batch_gen, device)
    params = list(model.parameters()) + (list(estimator.parameters()) if estimator is not None else [])
    optimizer = torch.optim.Adam(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    selection = _Selection(run, {name: norm.probs_from_linear for name, norm in norms.items()})
    curve = selection.curve
    selection.record(0)  # after pretraining (shown in the curves; not a candidate for selection)
    total_rows = total_batch_rows = total_examples = 0
    for epoch in range(1, settings.epochs + 1):
        done = _semi_supervised_epoch(run, estimator, unlabelled, optimizer, steps, epoch)
        curve["epoch_seconds"].append(done["wall"])
        curve["epoch_cpu_seconds"].append(done["cpu"])
        curve["rows_per_example"].append(done["rows"] / done["examples"])
        curve["batch_level_rows_per_example"].append(done["batch_rows"] / done["examples"])
        total_rows, total_batch_rows, total_examples = (total_rows + done["rows"],
                                                        total_batch_rows + done["batch_rows"],
                                                        total_examples + done["examples"])
        selection.record(epoch)

    model.load_state_dict(selection.best_state)
    return {
        "group": names,
        "seed": seed,
        "selected_epoch": selection.best_epoch,
        "steps_per_epoch": steps,
        **pretraining,
        "epoch_seconds": sum(curve["epoch_seconds"]) / len(curve["epoch_seconds"]),
        "epoch_cpu_seconds": sum(curve["epoch_cpu_seconds"]) / len(curve["epoch_cpu_seconds"]),
        "decoder_rows_per_example": total_rows / total_examples,
        "batch_level_rows_per_example": total_batch_rows / total_examples,
        "curve": curve,
        "evaluations": _test_evaluations(run, selection, estimator is not None),
    }

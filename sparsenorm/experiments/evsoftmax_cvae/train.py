"""Training one CVAE per (training setting, normalizer group, seed) and evaluating its prior along the way.

At every checkpoint (every ``eval_every`` steps and at the end) the evaluation-time prior p(z | y)
of each query is scored three ways (Appendix E.1 and Sec. 4.1):

* ``w_digits``: the 1-Wasserstein distance between ``sum_k Q(digit | x_k) p(z_k | y)`` and the
  uniform distribution over the query's five digits, digits as positions (our reading of App. E.1);
* ``w_authors``: ``scipy.stats.wasserstein_distance(marginal, target)`` with the probabilities as
  values, the authors' plotting script's metric (five equal modes of the wrong parity score 0);
* ``parity_mass``: the prior's mass on latent classes whose decoded digit (by Q) has the query's
  parity: the direct test of "the prior generates the right digits".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ... import registry
from .._shared import metrics
from .._shared.devices import seed_everything
from .._shared.mnist import MNIST
from .._shared.timing import Stopwatch, progress
from .model import CVAE, LATENT_CLASSES, QUERIES, negative_elbo

METRICS = ("w_digits", "w_authors", "parity_mass")
LOWER_IS_BETTER = {"w_digits": True, "w_authors": True, "parity_mass": False}
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


@dataclass(frozen=True)
class TrainingSetting:
    """What the KL-weight sweep varies: the optimizer, its learning rate and the KL weight; optionally a different
    optimizer for the prior MLP alone (issue 49: with SGD at the authors' KL weight the softmax prior barely moves,
    Adam on the prior alone lets it learn while the encoder and decoder train as the authors')."""

    optimizer: str
    learning_rate: float
    kl_weight: float
    prior_optimizer: Optional[str] = None
    prior_learning_rate: Optional[float] = None

    @property
    def label(self) -> str:
        """A file-name-safe name, e.g. ``sgd-lr0.001-kl0.00015625`` (``-prior-adam0.001`` with a prior optimizer)."""
        prior = f"-prior-{self.prior_optimizer}{self.prior_learning_rate:g}" if self.prior_optimizer else ""
        return f"{self.optimizer}-lr{self.learning_rate:g}-kl{self.kl_weight:g}{prior}"

    @property
    def title(self) -> str:
        kl = {0.01 / 64: "0.01/64 (authors' code)", 1 / 64: "1/64", 1.0: "1 (textbook ELBO)"}.get(
            self.kl_weight, f"{self.kl_weight:g}")
        prior = (f", prior by {self.prior_optimizer.upper()} lr {self.prior_learning_rate:g}"
                 if self.prior_optimizer else "")
        return f"{self.optimizer.upper()} lr {self.learning_rate:g}, KL weight {kl}{prior}"


def training_groups(names: Sequence[str]) -> List[List[str]]:
    """Normalizers whose training is identical (same train_forward and log_prob; e.g. softmax and
    post-hoc evidential, a softmax-trained model) share one trained model per seed."""
    groups: Dict[Tuple[Any, Any], List[str]] = {}
    for name in names:
        norm = registry.get(name)
        groups.setdefault((norm.train_forward, norm.log_prob), []).append(name)
    return list(groups.values())


def data_tensors(data: MNIST, device: torch.device, eval_size: int) -> Dict[str, Tensor]:
    """Training images with their parity queries (one-hot), and ``eval_size`` validation images."""
    def onehot(labels: np.ndarray) -> Tensor:
        return F.one_hot(torch.from_numpy(labels % 2), len(QUERIES)).float().to(device)

    n_eval = min(eval_size, len(data.val_labels))
    return {"x_train": torch.from_numpy(data.train_images).to(device), "y_train": onehot(data.train_labels),
            "x_val": torch.from_numpy(data.val_images[:n_eval]).to(device), "y_val": onehot(data.val_labels[:n_eval])}


@torch.no_grad()
def evaluate_prior(model: CVAE, norm, classifier) -> Dict[str, Any]:
    """Evaluation-time prior per query, Q on the decoded latent classes, and the three scores per query."""
    device = next(model.parameters()).device
    prior = norm.probs_from_linear(model.prior_hidden(torch.eye(len(QUERIES), device=device)), model.prior_head)
    images = torch.sigmoid(model.decode_logits(torch.eye(LATENT_CLASSES, device=device)))
    digit_probs = classifier.probs(images).double().cpu().numpy()
    prior_np = prior.double().cpu().numpy()
    marginal = metrics.marginal_digit_distribution(prior_np, digit_probs)
    decoded = digit_probs.argmax(-1)
    scores = {
        "w_digits": {q: metrics.class_wasserstein(marginal[i], metrics.parity_target(q))
                     for i, q in enumerate(QUERIES)},
        "w_authors": {q: metrics.authors_wasserstein(marginal[i], metrics.parity_target(q))
                      for i, q in enumerate(QUERIES)},
        "parity_mass": {q: metrics.parity_mass(prior_np[i], decoded, q) for i, q in enumerate(QUERIES)},
    }
    return {"prior": prior_np, "images": images.cpu().numpy(), "decoded": decoded, "marginal": marginal,
            "scores": scores}


@torch.no_grad()
def posterior_statistics(model: CVAE, norm, x: Tensor, y: Tensor) -> Dict[str, Any]:
    """Mean support size of q(z | x, y) at evaluation, how many latent classes are ever its argmax, and the
    aggregate posterior per query, mean over the images of that query of q(z | x, y): the prior that maximises the
    ELBO given this encoder (the regime gate of issue 49 reads the prior's distance to it)."""
    probs = norm.probs_from_linear(model.posterior_features(x, y), model.posterior_head)
    query = y.argmax(-1)
    aggregate = {q: probs[query == i].double().mean(0).cpu().tolist() for i, q in enumerate(QUERIES)
                 if bool((query == i).any())}
    return {"posterior_mean_support": float((probs > 0).sum(-1).double().mean()),
            "posterior_classes_used": int(probs.argmax(-1).unique().numel()),
            "aggregate_posterior": aggregate}


def _support(row: np.ndarray) -> List[int]:
    return [int(k) for k in np.flatnonzero(row > 0)]


def _results_per_normalizer(model: CVAE, norms: Dict[str, Any], trained_with: str, classifier,
                            initial: Dict[str, Dict[str, Any]], curves: Dict[str, Dict[str, Any]],
                            data: Dict[str, Tensor], keep_images: bool) -> Dict[str, Dict[str, Any]]:
    """The trained model read with each normalizer: its final prior against the one at initialisation,
    the decoded digits, posterior statistics on the validation images, and the curves."""
    model.eval()
    out: Dict[str, Dict[str, Any]] = {}
    for name, norm in norms.items():
        final, init = evaluate_prior(model, norm, classifier), initial[name]
        out[name] = {
            "trained_with": trained_with,
            "prior": {q: final["prior"][i].tolist() for i, q in enumerate(QUERIES)},
            "initial_prior": {q: init["prior"][i].tolist() for i, q in enumerate(QUERIES)},
            "support": {q: _support(final["prior"][i]) for i, q in enumerate(QUERIES)},
            "initial_support": {q: _support(init["prior"][i]) for i, q in enumerate(QUERIES)},
            "modes_above_1pct": {q: int(metrics.nonzero_count(final["prior"][i], 0.01)) for i, q in enumerate(QUERIES)},
            # Total variation between the evaluation-time prior at the end and at initialisation.
            "prior_change_since_init": float(0.5 * np.abs(final["prior"] - init["prior"]).sum(-1).mean()),
            "decoded_digit": final["decoded"].tolist(),
            "predicted_digit_distribution": {q: final["marginal"][i].tolist() for i, q in enumerate(QUERIES)},
            **posterior_statistics(model, norm, data["x_val"], data["y_val"]),
            "curve": curves[name],
        }
        if keep_images:  # for Fig. 2
            out[name]["images"] = np.round(final["images"], 3).tolist()
    return out


class _SeedRun:
    """One seed's own part of a training: its generators, data order, loss curve and checkpoints.

    The draws happen in the order of a run alone (a data order per epoch, then each step's Gumbel
    noise), so a seed's trajectory does not depend on whether it trains alone or stacked with others.
    """

    def __init__(self, seed: int, names: List[str], n: int, batch_size: int, latent: int, eval_every: int,
                 total: int, device: torch.device) -> None:
        self.seed, self.names, self.n, self.batch_size, self.latent = seed, names, n, batch_size, latent
        self.eval_every, self.total, self.device = eval_every, total, device
        self.steps_per_epoch = max(1, n // batch_size)
        self.gen = seed_everything(seed)  # also seeds the global generator the model's initialisation uses
        self.noise_gen = self.gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed)
        self.curves = {name: {"iteration": [], **{m: {q: [] for q in QUERIES} for m in METRICS}} for name in names}
        self.initial: Dict[str, Dict[str, Any]] = {}
        self.loss_curve: Dict[str, List[float]] = {"iteration": [], "neg_elbo_per_example": []}
        # The running loss stays on the device (float64, so the sum is the one float() would give):
        # read once per evaluation, not every step.
        self.running, self.running_count = torch.zeros((), dtype=torch.float64, device=device), 0
        self.order: Tensor = torch.empty(0)

    def start(self) -> None:
        """The first epoch's data order (drawn after the checkpoint at step 0, as always)."""
        self.order = torch.randperm(self.n, generator=self.gen).to(self.device)

    def batch(self, step: int) -> Tuple[Tensor, Tensor]:
        """Step ``step``'s example indices and its Gumbel-Softmax uniform noise."""
        offset = (step % self.steps_per_epoch) * self.batch_size
        if step > 0 and offset == 0:
            self.order = torch.randperm(self.n, generator=self.gen).to(self.device)
        idx = self.order[offset:offset + self.batch_size]
        uniform = torch.rand((len(idx), self.latent), generator=self.noise_gen, device=self.device)
        return idx, uniform

    def checkpoint(self, model: CVAE, norms: Dict[str, Any], classifier, step: int) -> None:
        model.eval()
        for name, norm in norms.items():
            result = evaluate_prior(model, norm, classifier)
            self.initial.setdefault(name, result)
            self.curves[name]["iteration"].append(step)
            for m in METRICS:
                for q in QUERIES:
                    self.curves[name][m][q].append(result["scores"][m][q])
        model.train()

    def after_step(self, step: int, loss: Tensor, batch: int) -> bool:
        """Add the step's loss to the running mean; True when a checkpoint is due (the loss curve gets its point)."""
        self.running += loss.detach().double() / batch
        self.running_count += 1
        done = step + 1
        if done % self.eval_every == 0 or done == self.total:
            self.loss_curve["iteration"].append(done)
            self.loss_curve["neg_elbo_per_example"].append(self.running.item() / self.running_count)
            self.running, self.running_count = self.running.new_zeros(()), 0
            return True
        return False


PRIOR_PREFIX = "prior_"
"""Parameters of the prior MLP (``prior_hidden``, ``prior_head``): what ``prior_optimizer`` trains."""


class _Optimizers:
    """One or two optimizers stepped together (the prior's own, when the setting has one)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


def _optimizer(setting: TrainingSetting, named_params) -> _Optimizers:
    """The setting's optimizer over ``named_params`` ((name, tensor) pairs); with ``prior_optimizer``, the prior's
    parameters go to that one instead (both are elementwise or plain SGD, so a stacked copy's step is its own)."""
    for name in (setting.optimizer, setting.prior_optimizer):
        if name is not None and name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    named = list(named_params)
    if setting.prior_optimizer is None:
        return _Optimizers([OPTIMIZERS[setting.optimizer]([p for _, p in named], lr=setting.learning_rate)])
    if setting.prior_learning_rate is None or not setting.prior_learning_rate > 0:
        raise ValueError(f"prior_learning_rate must be positive with a prior optimizer, got "
                         f"{setting.prior_learning_rate!r}")
    prior = [p for n, p in named if n.startswith(PRIOR_PREFIX)]
    rest = [p for n, p in named if not n.startswith(PRIOR_PREFIX)]
    if not prior:
        raise ValueError(f"no parameter named {PRIOR_PREFIX}*: the prior optimizer would train nothing")
    return _Optimizers([OPTIMIZERS[setting.optimizer](rest, lr=setting.learning_rate),
                        OPTIMIZERS[setting.prior_optimizer](prior, lr=setting.prior_learning_rate)])


def _total_steps(n: int, batch_size: int, epochs: int, max_steps) -> int:
    total = epochs * max(1, n // batch_size)
    return total if max_steps is None else min(total, max_steps)


def train_group(names: List[str], seed: int, setting: TrainingSetting, data: Dict[str, Tensor], classifier, *,
                epochs: int, batch_size: int, temperature: float, smoothing: float, eval_every: int,
                device: torch.device, max_steps=None, keep_images: bool = False) -> Dict[str, Dict[str, Any]]:
    """Train one CVAE with the (shared) training form of ``names``; evaluate it with each of them.

    Returns, per normalizer, the curves of the three scores (``curve[metric][query]`` at
    ``curve["iteration"]``), the final prior, its support now and at initialisation, and posterior
    statistics on the validation images.
    """
    norms = {name: registry.get(name) for name in names}
    train_norm = norms[names[0]]
    x_train, y_train = data["x_train"], data["y_train"]
    total = _total_steps(len(x_train), batch_size, epochs, max_steps)
    run = _SeedRun(seed, names, len(x_train), batch_size, LATENT_CLASSES, eval_every, total, device)
    model = CVAE().to(device)
    optimizer = _optimizer(setting, model.named_parameters())

    clock = Stopwatch()
    run.checkpoint(model, norms, classifier, 0)
    run.start()
    for step in progress(range(total), total=total, desc=f"cvae {setting.label} {'+'.join(names)} seed {seed}"):
        idx, uniform = run.batch(step)
        loss, _, _ = negative_elbo(model, train_norm, x_train[idx], y_train[idx], kl_weight=setting.kl_weight,
                                   temperature=temperature, smoothing=smoothing, generator=uniform)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if run.after_step(step, loss, len(idx)):
            run.checkpoint(model, norms, classifier, step + 1)
    train_time = clock.elapsed

    out = _results_per_normalizer(model, norms, train_norm.name, classifier, run.initial, run.curves, data, keep_images)
    return {"steps": total, "train_time_s": round(train_time, 1), "loss_curve": run.loss_curve, "normalizers": out}


def train_group_stacked(names: List[str], seeds: Sequence[int], setting: TrainingSetting, data: Dict[str, Tensor],
                        classifier, *, epochs: int, batch_size: int, temperature: float, smoothing: float,
                        eval_every: int, device: torch.device, max_steps=None,
                        keep_images: Sequence[bool] = ()) -> List[Dict[str, Dict[str, Any]]]:
    """:func:`train_group` for several seeds at once, one result per seed, trained as one stacked network
    per step (:mod:`.._shared.stacking`: each seed's initialisation, data order, Gumbel noise and optimizer
    state are its own, so each result equals :func:`train_group`'s for that seed up to float rounding).

    Each result's ``train_time_s`` is the stack's training time divided by the number of seeds (the
    seed's share). ``keep_images[i]``: keep seed ``seeds[i]``'s decoded images (default: none).
    """
    from .._shared.stacking import StackedModels

    seeds = list(seeds)
    keep = list(keep_images) or [False] * len(seeds)
    if len(keep) != len(seeds):
        raise ValueError(f"keep_images: one flag per seed, got {len(keep)} for {len(seeds)} seeds")
    norms = {name: registry.get(name) for name in names}
    train_norm = norms[names[0]]
    x_train, y_train = data["x_train"], data["y_train"]
    total = _total_steps(len(x_train), batch_size, epochs, max_steps)
    runs, models = [], []
    for seed in seeds:  # as train_group: seed, then build the model from the seeded global generator
        runs.append(_SeedRun(seed, names, len(x_train), batch_size, LATENT_CLASSES, eval_every, total, device))
        models.append(CVAE().to(device))
    stacked = StackedModels(models)
    optimizer = _optimizer(setting, stacked.params.items())
    reader = models[0]  # a seed's current parameters are copied into it for its checkpoints

    def loss_of(model: CVAE, x: Tensor, y: Tensor, uniform: Tensor) -> Tensor:
        return negative_elbo(model, train_norm, x, y, kl_weight=setting.kl_weight, temperature=temperature,
                             smoothing=smoothing, generator=uniform)[0]

    clock = Stopwatch()
    for s, run in enumerate(runs):
        run.checkpoint(stacked.copy(s, reader), norms, classifier, 0)
        run.start()
    label = f"cvae {setting.label} {'+'.join(names)} seeds {','.join(map(str, seeds))} (stacked)"
    for step in progress(range(total), total=total, desc=label):
        idx, uniform = zip(*(run.batch(step) for run in runs))
        idx, uniform = torch.stack(idx), torch.stack(uniform)
        losses = stacked(loss_of, x_train[idx], y_train[idx], uniform)  # (S,)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # copy s's parameters enter its own loss only: the sum's gradient is each loss's
        optimizer.step()
        for s, run in enumerate(runs):
            if run.after_step(step, losses[s], idx.shape[1]):
                run.checkpoint(stacked.copy(s, reader), norms, classifier, step + 1)
    share = round(clock.elapsed / len(seeds), 1)

    results = []
    for s, run in enumerate(runs):
        out = _results_per_normalizer(stacked.copy(s, reader), norms, train_norm.name, classifier, run.initial,
                                      run.curves, data, keep[s])
        results.append({"steps": total, "train_time_s": share, "loss_curve": run.loss_curve, "normalizers": out})
    return results

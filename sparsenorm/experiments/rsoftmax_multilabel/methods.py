"""The methods compared: one output layer and loss each, on the paper's two-layer network.

* ``softmax``: cross-entropy to the normalized label vector y/|y|; labels with p >= p0 for a grid
  of thresholds that scales with the number of classes C (``p0 = m / C``, see ``THRESHOLD_MULTIPLES``),
  plus the best p0 (chosen on the selection set), and the paper's fixed p0 in ``FIXED_THRESHOLDS``
  (never chosen as best; they judge the paper's "a fixed threshold fails at 20 and 30 classes").
* ``sparsemax+huber``: sparsemax with its multi-label loss (the registry's; Martins & Astudillo).
* ``sparsemax+hinge``: sparsemax with Laha et al.'s multi-label hinge loss at alpha = 1.
* ``sparsehourglass``: sparsehourglass with its multi-label hinge loss at ``hourglass_q``.
* ``r_softmax``: r-softmax with a per-example sparsity rate from a label-count head (an "additional
  layer", Sec. 4.1: linear or a one-hidden-layer MLP) and the Eq. 4 loss plus the count cross-entropy.
* ``ev_softmax``: trained through Eq. 10 with the cross-entropy to y/|y| (the registry's multi-label
  loss); the predicted set is the support of ev-softmax (Eq. 7).
* ``sigmoid``: one logistic output per label (binary cross-entropy), threshold 0.5.

Any other registry normalizer given with ``--normalizers`` is trained with its registry
multi-label loss and predicts its support.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import registry
from ...losses import SparsityRatePredictor, sparsehourglass_multilabel_hinge_loss
from ...losses.rsoftmax import eq4_loss, label_count_loss, r_softmax_loss
from .paper import (COUNT_DECODES, COUNT_HEADS, DEFAULT_NORMALIZERS, FIXED_THRESHOLDS, HIDDEN, RATE_GRADS,
                    SIGMOID_THRESHOLD, SPARSEMAX_HINGE_Q, THRESHOLD_MULTIPLES)


@dataclass(frozen=True)
class RSoftmaxOptions:
    """How r-softmax's label count becomes its sparsity rate, and how the rate is trained."""

    count_head: str = "linear"  # "linear" or "mlp" (one hidden layer of the network's width)
    count_decode: str = "argmax"  # "argmax" of the count logits, or "round-mean": the rounded expected count
    rate_grad: str = "through"  # "through": Eq. 4's gradient flows through the quantile; "detached" (authors' code)


@dataclass(frozen=True)
class Method:
    """One output layer + loss; ``normalizer`` is a registry name (None for the sigmoid baseline)."""

    key: str
    normalizer: Optional[str]
    loss: str
    count_head: Optional[str] = None  # r-softmax only

    def variants(self) -> List[str]:
        """Names of the predictions it yields (softmax: one per threshold)."""
        if self.key == "softmax":
            return ([softmax_variant(m) for m in THRESHOLD_MULTIPLES]
                    + [fixed_softmax_variant(p) for p in FIXED_THRESHOLDS])
        return [self.key]


def softmax_variant(multiple: float) -> str:
    return f"softmax (p0={multiple:g}/C)"


def fixed_softmax_variant(p0: float) -> str:
    """A softmax prediction at an absolute threshold (the paper's fixed grid), whatever the class count."""
    return f"softmax (p0={p0:g})"


def r_softmax_key(count_head: str) -> str:
    return f"r_softmax ({count_head} count)"


def methods_for(normalizers: Optional[Sequence[str]], count_heads: Sequence[str] = ("linear",)) -> List[Method]:
    """The methods to run: the paper's set by default, or those of the named normalizers.

    ``count_heads``: one r-softmax method per label-count head (two when the head is chosen on
    validation).
    """
    names = list(DEFAULT_NORMALIZERS) if normalizers is None else list(normalizers)
    out: List[Method] = []
    for name in names:
        registry.get(name)  # unknown names raise ValueError listing the known ones
        if name == "softmax":
            out.append(Method("softmax", "softmax", "cross-entropy to y/|y|, threshold p0 = m/C"))
        elif name == "sparsemax":
            out.append(Method("sparsemax+huber", "sparsemax", "sparsemax multi-label loss (Martins & Astudillo)"))
            out.append(Method("sparsemax+hinge", "sparsemax", "Laha et al. multi-label hinge loss, alpha = 1"))
        elif name == "r_softmax":
            for head in count_heads:
                out.append(Method(r_softmax_key(head), "r_softmax",
                                  f"Eq. 4 with r from a {head} label-count head + count cross-entropy", head))
        else:
            out.append(Method(name, name, f"registry multi-label loss of {name}"))
    if normalizers is None:
        out.append(Method("sigmoid", None, "per-label binary cross-entropy, threshold 0.5"))
    return out


class MultilabelNet(nn.Module):
    """The paper's two-layer network: ``Linear(d, 128) - ReLU - Linear(128, L)``.

    With ``count_head`` an extra head on the hidden features predicts the number of labels, hence
    r-softmax's sparsity rate (r-softmax paper, Sec. 4.1): ``"linear"`` is one linear layer (the
    paper's "additional layer", :class:`sparsenorm.losses.SparsityRatePredictor`), ``"mlp"`` one
    hidden ReLU layer of the same width before it.
    """

    def __init__(self, n_features: int, n_labels: int, hidden: int = HIDDEN, count_head: Optional[str] = None,
                 device=None):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(n_features, hidden, device=device), nn.ReLU())
        self.out = nn.Linear(hidden, n_labels, device=device)
        self.count_head = count_head
        self.rate = None
        if count_head is not None:
            if count_head not in COUNT_HEADS:
                raise ValueError(f"count_head must be one of {', '.join(COUNT_HEADS)}, got {count_head!r}")
            with torch.device(device or torch.get_default_device()):
                self.rate = SparsityRatePredictor(hidden, n_labels)
                if count_head == "mlp":
                    self.rate.layer = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(),
                                                    nn.Linear(hidden, n_labels + 1))

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        h = self.hidden(x)
        return h, self.out(h)


class StackedLinear(nn.Module):
    """``S`` independent linear layers applied at once: ``(S, B, in) -> (S, B, out)`` by one batched matmul.

    Built from ``S`` ordinary ``nn.Linear`` layers (their initial weights are copied), so each slice
    starts exactly where its own seeded network would; :meth:`member` copies slice ``s`` back out.
    """

    def __init__(self, layers: Sequence[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))  # (S, out, in)
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))  # (S, out)

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))

    @torch.no_grad()
    def member(self, s: int) -> nn.Linear:
        out_features, in_features = self.weight.shape[1:]
        layer = nn.Linear(in_features, out_features, device="meta").to_empty(device=self.weight.device)
        layer.weight.copy_(self.weight[s])
        layer.bias.copy_(self.bias[s])
        return layer


def _stack(modules: Sequence[nn.Module]) -> nn.Module:
    """Stack ``S`` structurally equal modules made of ``nn.Linear``, ``nn.ReLU`` and ``nn.Sequential``."""
    first = modules[0]
    if isinstance(first, nn.Linear):
        return StackedLinear(modules)
    if isinstance(first, nn.Sequential):
        return nn.Sequential(*(_stack(parts) for parts in zip(*modules)))
    if isinstance(first, nn.ReLU):
        return nn.ReLU()
    raise TypeError(f"cannot stack {type(first).__name__}")


def _member(module: nn.Module, s: int) -> nn.Module:
    if isinstance(module, StackedLinear):
        return module.member(s)
    if isinstance(module, nn.Sequential):
        return nn.Sequential(*(_member(part, s) for part in module))
    return nn.ReLU()


class StackedMultilabelNet(nn.Module):
    """``S`` :class:`MultilabelNet` s of the same shape trained side by side (one per seed or data set).

    ``forward`` takes ``(S, B, d)``, network ``s`` seeing ``x[s]``. The networks share no
    parameter, so with :func:`training_loss` (the sum of the per-network mean losses) and an
    element-wise optimizer such as Adam, each one follows exactly the trajectory it would follow
    alone; stacking only replaces ``S`` small matmuls by one batched matmul (a ~128-wide MLP is
    bound by per-step overhead on a CPU, not by arithmetic).
    """

    def __init__(self, nets: Sequence[MultilabelNet]):
        super().__init__()
        if not nets:
            raise ValueError("nets must hold at least one MultilabelNet")
        self.count_head = nets[0].count_head
        self.hidden = _stack([n.hidden for n in nets])
        self.out = _stack([n.out for n in nets])
        self.rate = None
        if nets[0].rate is not None:
            n_labels = nets[0].rate.n_classes
            with torch.device("meta"):  # no initialisation: the layer is replaced by the stacked one
                self.rate = SparsityRatePredictor(1, n_labels)
            self.rate.layer = _stack([n.rate.layer for n in nets])

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        h = self.hidden(x)
        return h, self.out(h)

    @torch.no_grad()
    def member(self, s: int) -> MultilabelNet:
        """A copy of network ``s`` as a plain :class:`MultilabelNet` (for evaluation)."""
        first = self.hidden[0].weight
        net = MultilabelNet(first.shape[2], self.out.weight.shape[1], first.shape[1], self.count_head, device="meta")
        net.hidden, net.out = _member(self.hidden, s), _member(self.out, s)
        if self.rate is not None:
            net.rate.layer = _member(self.rate.layer, s)
        return net


def decode_count(count_logits: Tensor, how: str) -> Tensor:
    """The predicted number of labels: arg-max of the count logits, or the rounded expected count."""
    if how == "argmax":
        return count_logits.detach().argmax(-1)
    if how == "round-mean":
        ks = torch.arange(count_logits.shape[-1], dtype=count_logits.dtype, device=count_logits.device)
        return (count_logits.detach().softmax(-1) * ks).sum(-1).round().long()
    raise ValueError(f"count_decode must be one of {', '.join(COUNT_DECODES)}, got {how!r}")


def rate_from_count(count: Tensor, n_labels: int) -> Tensor:
    """r = (C - k) / C, the fraction of zeros (Eq. 3's sparsity rate), per example."""
    return ((n_labels - count.to(torch.get_default_dtype())) / n_labels).clamp(0.0, 1.0)


def r_softmax_detached_threshold(x: Tensor, r: Tensor) -> Tensor:
    """r-softmax (Eq. 3) over the last dim with the quantile threshold detached, as in the authors' code.

    ``r`` has one value per row. ``r = 1`` is taken as the one-hot arg-max limit, as
    :func:`sparsenorm.r_softmax` defines it (the rate is capped just below 1, which leaves only
    the row maximum above the threshold).
    """
    n = x.shape[-1]
    r = r.reshape(-1, 1).to(x.dtype).clamp(max=1.0 - 0.5 / max(n - 1, 1))
    ordered = x.detach().sort(-1).values
    position = r * (n - 1)
    lo = position.floor().long()
    hi = position.ceil().long().clamp(max=n - 1)
    tau = torch.lerp(ordered.gather(-1, lo), ordered.gather(-1, hi), position - lo)
    weights = (x - tau).clamp_min(0) * torch.exp(x - x.detach().max(-1, keepdim=True).values)
    return weights / weights.sum(-1, keepdim=True)


def sparsemax_hinge_loss(logits: Tensor, target: Tensor) -> Tensor:
    """Laha et al.'s multi-label hinge loss for sparsemax: their pairwise loss with alpha = 1.

    As q -> infinity, sparsehourglass's alpha(z) = (1 + qK) / (|sum z| + qK) -> 1 and
    sparsehourglass(z) = sparsemax(alpha z) becomes sparsemax, so the q -> infinity loss is the
    sparsemax hinge loss (Laha et al.'s ``sparsegen_lin`` loss with lambda = 0);
    ``SPARSEMAX_HINGE_Q`` = 1e12 puts alpha within 1e-10 of 1 for logit sums below 1e3.
    """
    return sparsehourglass_multilabel_hinge_loss(logits, target, q=SPARSEMAX_HINGE_Q)


def r_softmax_loss_for(count_logits: Tensor, logits: Tensor, y: Tensor, options: RSoftmaxOptions) -> Tensor:
    """Eq. 4 with the rate of the predicted count, plus the count cross-entropy (Sec. 4.1); rows ``(N, C)``."""
    r = rate_from_count(decode_count(count_logits, options.count_decode), y.shape[1]).to(logits.dtype)
    if options.rate_grad == "through":
        eq4 = r_softmax_loss(logits, y, r=r)
    elif options.rate_grad == "detached":
        eq4 = eq4_loss(logits, y, lambda z: r_softmax_detached_threshold(z, r))
    else:
        raise ValueError(f"rate_grad must be one of {', '.join(RATE_GRADS)}, got {options.rate_grad!r}")
    return eq4 + label_count_loss(count_logits, y)


def training_loss(method: Method, model: nn.Module, x: Tensor, y: Tensor, *, hourglass_q: float = 1.0,
                  rsoftmax: RSoftmaxOptions = RSoftmaxOptions()) -> Tensor:
    """The method's loss on a batch (``y`` float 0/1).

    ``model`` is a :class:`MultilabelNet` with ``x`` ``(B, d)``, or a :class:`StackedMultilabelNet`
    of ``S`` networks with ``x`` ``(S, B, d)``; then the loss is the sum of the ``S`` networks' own
    mean losses (every loss here is a mean over equally many rows per network, so ``S`` times the
    mean over all rows), and each network receives exactly the gradient of its own loss.
    """
    h, logits = model(x)
    stacked = x.shape[0] if x.dim() == 3 else 1
    n_labels = logits.shape[-1]
    logits, y = logits.reshape(-1, n_labels), y.reshape(-1, n_labels)
    if method.normalizer is None:
        loss = F.binary_cross_entropy_with_logits(logits, y)
    elif method.key == "sparsemax+hinge":
        loss = sparsemax_hinge_loss(logits, y)
    elif method.normalizer == "r_softmax":
        loss = r_softmax_loss_for(model.rate(h).reshape(-1, n_labels + 1), logits, y, rsoftmax)
    elif method.normalizer == "sparsehourglass":
        loss = registry.get("sparsehourglass", q=hourglass_q).multi_label_loss(logits, y)
    else:
        loss = registry.get(method.normalizer).multi_label_loss(logits, y)
    return loss * stacked


@torch.no_grad()
def predict(method: Method, model: MultilabelNet, x: Tensor, *, hourglass_q: float = 1.0,
            rsoftmax: RSoftmaxOptions = RSoftmaxOptions()
            ) -> Tuple[Dict[str, np.ndarray], np.ndarray, Optional[np.ndarray]]:
    """0/1 predicted label sets per variant, the label scores (for top-k ranking) and r-softmax's predicted counts."""
    h, logits = model(x)
    scores = logits.cpu().numpy()
    if method.normalizer is None:
        return {method.key: (torch.sigmoid(logits) >= SIGMOID_THRESHOLD).cpu().numpy()}, scores, None
    n_labels = logits.shape[-1]
    if method.key == "softmax":
        probs = registry.get("softmax").forward(logits, dim=-1)
        sets = {softmax_variant(m): (probs >= m / n_labels).cpu().numpy() for m in THRESHOLD_MULTIPLES}
        sets.update({fixed_softmax_variant(p0): (probs >= p0).cpu().numpy() for p0 in FIXED_THRESHOLDS})
        return sets, scores, None
    if method.normalizer == "r_softmax":
        from ...rsoftmax import r_softmax

        count = decode_count(model.rate(h), rsoftmax.count_decode)
        probs = r_softmax(logits, rate_from_count(count, n_labels).to(logits.dtype), dim=-1)
        return {method.key: (probs > 0).cpu().numpy()}, scores, count.cpu().numpy()
    if method.normalizer == "sparsehourglass":
        probs = registry.get("sparsehourglass", q=hourglass_q).forward(logits, dim=-1)
    else:
        probs = registry.get(method.normalizer).probs_from_linear(h, model.out)
    return {method.key: (probs > 0).cpu().numpy()}, scores, None

"""The one table of normalizers: experiments, benchmarks and the CLI take a normalizer by name here.

Each entry pairs a normalizer's evaluation-time function with its training-time form, its
log-probability function (where one exists), its default losses for single-label (class index) and
multi-label (target distribution / multi-hot) targets, and its capabilities (``cpu_kernel``,
``supports_mask``, ``attention``, ``entmax_twin``, ``attention_threshold``, ``alpha``,
``linear_loss``; the post-hoc switch ``trains_as``/``evaluates_as`` behind
:meth:`Normalizer.for_mode`), which is what the benchmark, the experiments and the attention layer
select by. Code elsewhere takes normalizers from here rather
than listing names.

All callables take logits first and normalize over ``dim=-1`` (functions) or classes on dim 1
(losses, as ``torch.nn.CrossEntropyLoss``). Parameters such as ``alpha``, ``t``, ``r`` and ``q``
are bound to the defaults in ``params``; pass ``**overrides`` to :func:`get` to change them.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Dict, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from . import evidential, hourglass, rsoftmax
from .entmax import entmax15, entmax_bisect, sparsemax
from .losses import evidential as ev_losses
from .losses import fenchel_young, hourglass as hourglass_losses, rsoftmax as r_losses
from .losses.softmax import softmax_multilabel_loss
from .softmax import masked_log_softmax, masked_softmax

__all__ = ["Normalizer", "NORMALIZERS", "names", "get"]  # the public names (the API reference documents these)


@dataclass(frozen=True)
class Normalizer:
    """A normalizer with everything needed to train and evaluate with it."""

    name: str
    description: str
    forward: Callable[..., Tensor]
    """Evaluation-time mapping ``(logits, dim=-1) -> probabilities``."""
    train_forward: Callable[..., Tensor]
    """Training-time mapping (e.g. ev-softmax's full-support Eq. 10); ``forward`` where they agree."""
    log_prob: Optional[Callable[..., Tensor]]
    """Log of ``train_forward`` computed in log space, or None where the output has exact zeros."""
    single_label_loss: Callable[..., Tensor]
    """``(logits (N, C, ...), target class indices, reduction=..., ignore_index=...) -> loss``; reduced
    with ``reduction='mean'`` unless told otherwise (as ``F.cross_entropy``; the Fenchel-Young
    functions themselves return per-row losses by default, as the ``entmax`` package's do)."""
    multi_label_loss: Callable[..., Tensor]
    """``(logits (N, C), target multi-hot or distribution (N, C), reduction=...) -> loss``, ``'mean'``
    by default."""
    sparse: bool
    """Whether ``forward`` can output exact zeros (so its support is a predicted label set)."""
    params: Dict[str, float] = field(default_factory=dict)
    posthoc: bool = False
    """True for post-hoc evidential: trained as softmax, sparsified from the last linear layer."""
    cpu_kernel: bool = False
    """Whether ``forward`` runs a fused C++ kernel on CPU (``sparsenorm.kernels``) where built."""
    supports_mask: bool = True
    """Whether ``forward`` takes ``mask=`` (boolean, True = keep)."""
    attention: bool = True
    """Whether ``forward`` is usable as an attention normalizer: a function of the scores alone
    (no linear layer), taking ``mask=``, differentiable w.r.t. the scores."""
    entmax_twin: Optional[str] = None
    """The ``entmax`` package's function computing the same map, if any (for comparisons)."""
    attention_threshold: Optional[str] = None
    """What attention may do with this map without the L x S score matrix
    (``sparsenorm.kernels.attention.dispatch`` keys its memory-efficient kernels by this):
    ``"known"`` -- the threshold is known before the pass over the keys (ev-softmax: the mean score
    is ``q . mean(k)``);
    ``"searched"`` -- the threshold must be searched over key blocks (sparsemax, entmax: a
    bisection on tau with running sums); ``"softmax"`` -- the map is softmax itself, whose
    attention is torch's fused ``scaled_dot_product_attention``; None -- it needs the whole row at
    once (a quantile, a sort, a sum over the row): attention builds the scores."""
    alpha: Optional[float] = None
    """The entmax ``alpha`` of a ``"searched"`` map (sparsemax = 2, 1.5-entmax = 1.5, bisection: its
    ``alpha`` parameter), which is what a threshold search needs to know about it."""
    linear_loss: Optional[str] = None
    """Streamable single-label loss: the kind of the fused op ``sparsenorm::linear_loss``
    (``sparsenorm.kernels.ops.linear_loss``) that computes ``single_label_loss(F.linear(h, W, b), y)``
    from ``h``, ``W`` and ``b`` without the N x V logits (:func:`sparsenorm.fused_linear_loss`), or
    None where the loss needs the whole row in a way that is not streamed."""
    trains_as: Optional[str] = None
    """Post-hoc forms: the registry name of the map used while training (see :meth:`for_mode`)."""
    evaluates_as: Optional[str] = None
    """Post-hoc forms: the registry name of the map used at evaluation where the linear layer is
    the attention keys (post-hoc evidential = ev-softmax there, Theorem 3.1)."""

    def for_mode(self, training: bool) -> "Normalizer":
        """The entry that computes attention weights in this mode: the one place the post-hoc switch
        lives. Post-hoc evidential trains as softmax and evaluates as ev-softmax; every other entry
        is itself in both modes."""
        form = self.trains_as if training else self.evaluates_as
        return self if form is None else NORMALIZERS[form]

    def probs_from_linear(self, features: Tensor, layer: nn.Linear) -> Tensor:
        """Evaluation-time probabilities of ``layer(features)``.

        The same call for every normalizer; post-hoc evidential needs the layer's weights
        (Itkina et al., ev-softmax paper Appendix A), the others only its output.
        """
        if self.posthoc:
            return evidential.posthoc_evidential(features, layer.weight, layer.bias)
        return self.forward(layer(features), dim=-1)


def _rebind(entry: Normalizer, params: Dict[str, float]) -> Normalizer:
    """``entry`` with ``params`` bound to each of its callables that takes them (a ``partial``: see
    ``_build``; each gets the parameters its signature names) and ``alpha`` from ``params``."""
    def rebind(fn):
        if not isinstance(fn, partial):
            return fn
        accepted = inspect.signature(fn.func).parameters
        return partial(fn.func, **{**fn.keywords, **{k: v for k, v in params.items() if k in accepted}})

    return replace(
        entry, forward=rebind(entry.forward), train_forward=rebind(entry.train_forward),
        log_prob=rebind(entry.log_prob) if entry.log_prob else None,
        single_label_loss=rebind(entry.single_label_loss), multi_label_loss=rebind(entry.multi_label_loss),
        params=params, alpha=params.get("alpha", entry.alpha),
    )


def _build() -> Dict[str, Normalizer]:
    # ``takes_params(fn)`` marks a callable that gets the entry's ``params`` it accepts (by name), bound
    # once from ``params`` below (and rebound by :func:`get`): each default is written once, in ``params``.
    takes_params = partial
    # The Fenchel-Young losses return one loss per row by default (the ``entmax`` package's functions do);
    # the registry's losses reduce with 'mean' by default, as F.cross_entropy and every other entry here.
    mean = partial(partial, reduction="mean")

    entries = [
        Normalizer(
            "softmax", "Softmax: dense, the baseline.",
            masked_softmax, masked_softmax, masked_log_softmax,
            F.cross_entropy, softmax_multilabel_loss, sparse=False, linear_loss="softmax",
            attention_threshold="softmax",
        ),
        Normalizer(
            "ev_softmax", "Evidential softmax (Chen et al. 2021, Eq. 7); trained through Eq. 10.",
            evidential.ev_softmax, takes_params(evidential.ev_softmax_train),
            takes_params(evidential.log_ev_softmax_train),
            ev_losses.ev_softmax_nll_loss, ev_losses.ev_softmax_multilabel_loss, sparse=True,
            params={"eps": 1e-6}, cpu_kernel=True, attention_threshold="known", linear_loss="ev_softmax",
        ),
        Normalizer(
            "posthoc_evidential",
            "Post-hoc evidential sparsification (Itkina et al. 2020): softmax-trained, sparsified at test time.",
            masked_softmax, masked_softmax, masked_log_softmax,
            F.cross_entropy, softmax_multilabel_loss, sparse=True, posthoc=True, attention=False,
            trains_as="softmax", evaluates_as="ev_softmax", linear_loss="softmax",
        ),
        Normalizer(
            "sparsemax", "Sparsemax (Martins & Astudillo 2016): Euclidean projection onto the simplex.",
            sparsemax, sparsemax, None,
            mean(fenchel_young.sparsemax_loss), mean(fenchel_young.sparsemax_loss), sparse=True,
            cpu_kernel=True, entmax_twin="sparsemax", attention_threshold="searched", alpha=2.0,
            linear_loss="sparsemax",
        ),
        Normalizer(
            "entmax15", "1.5-entmax (Peters et al. 2019), exact threshold (no full sort).",
            entmax15, entmax15, None,
            mean(fenchel_young.entmax15_loss), mean(fenchel_young.entmax15_loss), sparse=True,
            cpu_kernel=True, entmax_twin="entmax15", attention_threshold="searched", alpha=1.5,
            linear_loss="entmax15",
        ),
        Normalizer(
            "entmax_bisect", "alpha-entmax by bisection (Peters et al. 2019); alpha in params.",
            takes_params(entmax_bisect), takes_params(entmax_bisect), None,
            takes_params(mean(fenchel_young.entmax_bisect_loss)), takes_params(mean(fenchel_young.entmax_bisect_loss)),
            sparse=True, params={"alpha": 1.5}, entmax_twin="entmax_bisect", attention_threshold="searched",
            linear_loss="entmax_bisect",
        ),
        Normalizer(
            "t_softmax", "t-softmax (Bałazy et al., r-softmax paper Eq. 1), temperature-like t.",
            takes_params(rsoftmax.t_softmax), takes_params(rsoftmax.t_softmax), None,
            takes_params(r_losses.t_softmax_loss), takes_params(r_losses.t_softmax_loss),
            sparse=True, params={"t": 1.0},
        ),
        Normalizer(
            "r_softmax", "r-softmax (Bałazy et al., Eq. 3): a fraction r of the entries is zero.",
            takes_params(rsoftmax.r_softmax), takes_params(rsoftmax.r_softmax), None,
            takes_params(r_losses.r_softmax_loss), takes_params(r_losses.r_softmax_loss),
            sparse=True, params={"r": 0.5}, cpu_kernel=True,
        ),
        Normalizer(
            "sparsehourglass", "Sparsehourglass (Laha et al. 2018): sparsemax of a rescaled input.",
            takes_params(hourglass.sparsehourglass), takes_params(hourglass.sparsehourglass), None,
            takes_params(hourglass_losses.sparsehourglass_hinge_loss),
            takes_params(hourglass_losses.sparsehourglass_multilabel_hinge_loss),
            sparse=True, params={"q": 1.0},
        ),
    ]
    return {n.name: _rebind(n, n.params) for n in entries}


NORMALIZERS: Dict[str, Normalizer] = _build()
"""Every normalizer by name, in a fixed order (:func:`names`); read it through :func:`get`."""


def names() -> list[str]:
    """The registered normalizers' names, in the registry's order."""
    return list(NORMALIZERS)


def get(name: str, **overrides) -> Normalizer:
    """The normalizer called ``name``; ``overrides`` rebinds its parameters (e.g. ``alpha=1.3``).

    Raises ``ValueError`` listing the known names when ``name`` is unknown.
    """
    if name not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {name!r}; known normalizers: {', '.join(NORMALIZERS)}")
    entry = NORMALIZERS[name]
    if not overrides:
        return entry
    unknown = set(overrides) - set(entry.params)
    if unknown:
        raise ValueError(
            f"normalizer {name!r} has no parameter(s) {sorted(unknown)}; "
            f"its parameters: {sorted(entry.params) or 'none'}"
        )
    return _rebind(entry, {**entry.params, **overrides})

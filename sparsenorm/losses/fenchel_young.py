"""Fenchel–Young losses of sparsemax and entmax (drop-in for the ``entmax`` package's losses).

For a regularizer given by a generalized entropy ``H`` and its prediction map
``p*(z) = argmax_{p in simplex} <z, p> + H(p)``, the Fenchel–Young loss of logits ``z`` against a
target distribution ``q`` is (Blondel, Martins & Niculae 2020; Peters et al. 2019, Sec. 3)

    L(z; q) = H(p*) - H(q) + <p* - q, z>,       gradient  dL/dz = p* - q.

It is >= 0, and 0 exactly when ``p*(z) = q``. With ``H`` the Tsallis entropy
``H_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))`` (Shannon entropy at ``alpha = 1``):

* ``alpha = 2``: the sparsemax loss (Martins & Astudillo 2016, Eq. 19 multi-class and its
  multi-label form ``-q^T z + 1/2 sum_{j in S} (z_j^2 - tau^2) + 1/2 ||q||^2``);
* ``alpha = 1.5``: the 1.5-entmax loss; any ``alpha > 0`` with the bisection versions (as the
  ``entmax`` package).

Targets follow ``torch.nn.CrossEntropyLoss``: logits ``(N, C)`` / ``(N, C, d1, ...)`` / ``(C,)``,
with either integer class indices (``q = e_y``; ``ignore_index``, default -100 and negative values
included, drops rows) or a floating target of the logits' shape (multi-label: rows are normalized
to ``q = y / sum(y)``, as the sparsemax paper does; a row with no mass gives loss 0 and no
gradient; negative entries raise ``ValueError``). ``weight`` (C,) weights each row by its target
class (``q @ weight`` for distributions), and ``'mean'`` divides by the total weight, as
CrossEntropyLoss does. ``reduction`` is ``'mean'`` (``'elementwise_mean'`` is the ``entmax``
package's name for it), ``'sum'`` or ``'none'``. ``mask`` (boolean, broadcastable to the logits,
True = keep) marks classes that are not there, as do ``-inf`` logits and logits at or below
``finfo(dtype).min / 2``: they get probability 0 (a target on one gives an infinite loss).

The ``entmax`` package's calls work unchanged (a change of import): each function takes
``entmax``'s arguments in ``entmax``'s order -- ``(X, target, k=None)``, ``(X, target, n_iter=50)``,
``(X, target, alpha=1.5, n_iter=50)`` -- and, like ``entmax``, returns one loss per row
(``reduction='none'`` is the functions' default); the modules take ``entmax``'s constructor arguments
in its order (``k``/``alpha``/``n_iter``, ``ignore_index``, ``reduction``, default
``'elementwise_mean'``) and ``forward(X, target)``. sparsenorm's own loss API is there by keyword:
``weight``, ``ignore_index``, ``reduction`` (``'mean'`` as CrossEntropyLoss) and ``mask`` (keyword-only
in the functions; ``weight`` after ``entmax``'s arguments in the modules).
The backward is closed-form, ``p* - q``, from one saved tensor.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from .._validation import check_floating, check_k, check_n_iter, check_param, compute_dtype, value_checks_enabled
from ..entmax import entmax15, entmax_bisect, sparsemax, sparsemax_bisect
from ..kernels.ops.fenchel_young import FenchelYoungLossFunction
from ._common import check_reduction, class_weight_per_row, flatten_logits_and_target, reduce_loss

__all__ = [
    "sparsemax_loss", "sparsemax_bisect_loss", "entmax15_loss", "entmax_bisect_loss",
    "SparsemaxLoss", "SparsemaxBisectLoss", "Entmax15Loss", "EntmaxBisectLoss",
]


def _check_weight(weight) -> None:
    if weight is not None and not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a tensor of per-class weights or None, got {type(weight).__name__}")


def _alpha_rows(alpha: Union[float, Tensor], logits: Tensor, out_shape, n_rows: int, dtype) -> Union[float, Tensor]:
    """alpha as a float, or a tensor of shape (M,) matching the flattened rows."""
    if not isinstance(alpha, Tensor):
        return float(alpha)
    a = alpha.to(dtype)
    if a.dim() == logits.dim() and logits.dim() >= 2 and a.shape[1] == 1:
        a = a.squeeze(1)  # entmax_bisect's per-row layout (N, 1, ...)
    try:
        return a.expand(out_shape).reshape(n_rows)
    except RuntimeError:
        raise ValueError(
            f"alpha of shape {tuple(alpha.shape)} must broadcast to the per-example loss shape {tuple(out_shape)}"
        ) from None


def _fenchel_young_loss(
    input: Tensor,
    target: Tensor,
    make_project: Callable[[Union[float, Tensor]], Callable[[Tensor], Tensor]],
    alpha: Union[float, Tensor],
    weight: Optional[Tensor],
    ignore_index: int,
    reduction: str,
    mask: Optional[Tensor] = None,
) -> Tensor:
    _check_weight(weight)
    check_reduction(reduction)
    check_floating(input, "X")
    batch = flatten_logits_and_target(input, target, ignore_index=ignore_index, mask=mask, logits_name="X")
    dtype = compute_dtype(input)
    z = batch.logits.to(dtype)
    a = _alpha_rows(alpha, input, batch.out_shape, z.shape[0], dtype)
    project = make_project(a)
    with torch.no_grad():
        p = project(z.detach())
    if batch.target_dist is not None:
        y = batch.target_dist.to(dtype)
        if value_checks_enabled(y) and bool((y < 0).any()):
            raise ValueError("target distribution has negative entries")
        mass = y.sum(-1, keepdim=True)
        q = y / torch.where(mass > 0, mass, torch.ones_like(mass))
        batch.target_dist = q
        # Rows without labels: make the target equal the prediction, so loss and gradient are 0.
        q = torch.where(mass > 0, q, p)
    else:
        q = torch.zeros_like(z).scatter_(1, batch.target_index.unsqueeze(1), 1.0)
    per_row = FenchelYoungLossFunction.apply(z, q, a, p)
    row_weight = class_weight_per_row(batch, weight)
    if row_weight is not None:
        row_weight = row_weight.to(dtype)
    loss = reduce_loss(per_row, batch, reduction, row_weight)
    return loss.to(input.dtype)


# ----------------------------------------------------------------------------- functions

def sparsemax_loss(
    X: Tensor,
    target: Tensor,
    k: Optional[int] = None,
    *,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "none",
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Sparsemax loss (Martins & Astudillo 2016, Eq. 19): ``-z_y + 1/2 sum_{j in S}(z_j^2 - tau^2) + 1/2``.

    For a floating target ``q``: ``-q^T z + 1/2 sum_{j in S} (z_j^2 - tau^2) + 1/2 ||q||^2``.
    Gradient ``sparsemax(z) - q``. Convex, >= 0, zero iff ``sparsemax(z) = q``; in the binary case
    with ``z = (t, 0)`` and target class 0 it is the modified Huber loss of the margin ``t``:
    0 for ``t >= 1``, ``(1 - t)^2 / 4`` for ``-1 < t < 1``, ``-t`` for ``t <= -1``.
    ``k`` is the partial-sort speed hint of :func:`sparsenorm.sparsemax`. ``entmax.sparsemax_loss``'s
    arguments and per-row result (``reduction='none'`` by default; ``'mean'``/``'sum'`` reduce, as
    CrossEntropyLoss). See the module docstring for the target/weight/reduction conventions.
    """
    check_k(k)
    return _fenchel_young_loss(X, target, lambda a: lambda z: sparsemax(z, dim=-1, k=k), 2.0, weight, ignore_index,
                               reduction, mask)


def sparsemax_bisect_loss(
    X: Tensor,
    target: Tensor,
    n_iter: int = 50,
    *,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "none",
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Sparsemax loss with ``p*`` computed by bisection (:func:`sparsenorm.sparsemax_bisect`);
    ``entmax.sparsemax_bisect_loss``'s arguments and per-row result (``reduction='none'`` by default)."""
    check_n_iter(n_iter)
    return _fenchel_young_loss(
        X, target, lambda a: lambda z: sparsemax_bisect(z, dim=-1, n_iter=n_iter), 2.0, weight, ignore_index,
        reduction, mask,
    )


def entmax15_loss(
    X: Tensor,
    target: Tensor,
    k: Optional[int] = None,
    *,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "none",
    mask: Optional[Tensor] = None,
) -> Tensor:
    """1.5-entmax Fenchel–Young loss ``H_1.5(p*) - H_1.5(q) + <p* - q, z>``,
    ``H_1.5(p) = (1 - sum p^1.5) / 0.75``; gradient ``entmax15(z) - q``. ``entmax.entmax15_loss``'s
    arguments and per-row result (``reduction='none'`` by default)."""
    check_k(k)
    return _fenchel_young_loss(X, target, lambda a: lambda z: entmax15(z, dim=-1, k=k), 1.5, weight, ignore_index,
                               reduction, mask)


def entmax_bisect_loss(
    X: Tensor,
    target: Tensor,
    alpha: Union[float, Tensor] = 1.5,
    n_iter: int = 50,
    *,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "none",
    mask: Optional[Tensor] = None,
) -> Tensor:
    """alpha-entmax Fenchel–Young loss ``H_alpha(p*) - H_alpha(q) + <p* - q, z>`` with
    ``H_alpha(p) = (1 - sum p^alpha) / (alpha (alpha - 1))`` (Shannon at ``alpha = 1``, giving
    cross-entropy/KL); ``p*`` by bisection. Gradient ``p* - q``; with a tensor ``alpha`` (float or
    broadcastable to the per-example loss shape) also ``dL/dalpha = dH_alpha(p*)/dalpha -
    dH_alpha(q)/dalpha`` (Danskin), returned as 0 at ``alpha = 1`` where it is 0/0. Any
    ``alpha > 0`` (``0 < alpha < 1``: a dense map, as in the ``entmax`` package).
    ``entmax.entmax_bisect_loss``'s arguments and per-row result (``reduction='none'`` by default).
    """
    check_n_iter(n_iter)
    if isinstance(alpha, Tensor):
        check_floating(alpha, "alpha")
    check_param(alpha, "alpha", low=0.0, low_inclusive=False)

    def make_project(a: Union[float, Tensor]) -> Callable[[Tensor], Tensor]:
        a_rows = a.detach().unsqueeze(-1) if isinstance(a, Tensor) else a
        return lambda z: entmax_bisect(z, alpha=a_rows, dim=-1, n_iter=n_iter)

    return _fenchel_young_loss(X, target, make_project, alpha, weight, ignore_index, reduction, mask)


# ----------------------------------------------------------------------------- modules

class _FenchelYoungLoss(nn.Module):
    """The one module wrapper of the Fenchel–Young losses: CrossEntropyLoss's ``weight`` (a buffer),
    ``ignore_index`` and ``reduction``, plus the map's own ``options`` (``k``, ``n_iter``, ``alpha``: kept as
    attributes, an ``nn.Parameter`` ``alpha`` registered as a parameter), passed to ``loss_function``."""

    loss_function: Callable[..., Tensor]

    def __init__(self, ignore_index: int, reduction: str, weight: Optional[Tensor], **options):
        super().__init__()
        check_reduction(reduction)
        _check_weight(weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.register_buffer("weight", weight)
        self._options = tuple(options)
        for name, value in options.items():
            setattr(self, name, value)

    def forward(self, X: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        options = {name: getattr(self, name) for name in self._options}
        return type(self).loss_function(X, target, weight=self.weight, ignore_index=self.ignore_index,
                                        reduction=self.reduction, mask=mask, **options)


class SparsemaxLoss(_FenchelYoungLoss):
    """Module form of :func:`sparsemax_loss`; arguments as ``entmax.SparsemaxLoss`` plus ``weight``."""

    loss_function = staticmethod(sparsemax_loss)

    def __init__(self, k: Optional[int] = None, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 weight: Optional[Tensor] = None):
        check_k(k)
        super().__init__(ignore_index, reduction, weight, k=k)


class SparsemaxBisectLoss(_FenchelYoungLoss):
    """Module form of :func:`sparsemax_bisect_loss`; arguments as ``entmax.SparsemaxBisectLoss``."""

    loss_function = staticmethod(sparsemax_bisect_loss)

    def __init__(self, n_iter: int = 50, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 weight: Optional[Tensor] = None):
        check_n_iter(n_iter)
        super().__init__(ignore_index, reduction, weight, n_iter=n_iter)


class Entmax15Loss(_FenchelYoungLoss):
    """Module form of :func:`entmax15_loss`; arguments as ``entmax.Entmax15Loss`` (``k=100`` there
    too; ``k`` is only a speed hint, the loss is exact) plus ``weight``."""

    loss_function = staticmethod(entmax15_loss)

    def __init__(self, k: Optional[int] = 100, ignore_index: int = -100, reduction: str = "elementwise_mean",
                 weight: Optional[Tensor] = None):
        check_k(k)
        super().__init__(ignore_index, reduction, weight, k=k)


class EntmaxBisectLoss(_FenchelYoungLoss):
    """Module form of :func:`entmax_bisect_loss`; arguments as ``entmax.EntmaxBisectLoss`` plus
    ``weight``. ``alpha`` may be an ``nn.Parameter`` (it then gets a gradient)."""

    loss_function = staticmethod(entmax_bisect_loss)

    def __init__(self, alpha: Union[float, Tensor] = 1.5, n_iter: int = 50, ignore_index: int = -100,
                 reduction: str = "elementwise_mean", weight: Optional[Tensor] = None):
        check_n_iter(n_iter)
        super().__init__(ignore_index, reduction, weight, alpha=alpha, n_iter=n_iter)

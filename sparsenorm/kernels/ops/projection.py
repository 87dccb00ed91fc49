"""sparsemax and entmax on the op layer: ``sparsenorm::project`` (exact sparsemax / 1.5-entmax),
``sparsenorm::entmax_bisect`` (alpha-entmax with one ``alpha > 1``), their fused backward ops and
autograd formulas, and the ``autograd.Function`` classes of the bisections that no op covers (a
tensor ``alpha`` or ``alpha <= 1``, with the gradient w.r.t. ``alpha``; sparsemax by bisection).

C++ autograd on CPU. The Python autograd registered here runs in Python frames per
forward+backward (dispatcher -> generated autograd.Function -> redispatch -> CPU kernel), several
times the row work at small shapes (``benchmarks/results/tuning_cpu.json#cpp_autograd``). So the
evidential and projection extensions also register, for
``ev_softmax``, ``project`` and ``entmax_bisect``, a C++ autograd kernel under the dispatch key
``AutogradCPU`` (more specific than the ``Autograd`` alias these Python formulas are registered
under): once the extension is loaded (on the first call that may use it), CPU tensors get a C++
graph node, other devices keep the Python autograd. It changes no result: its forward redispatches
to the op below autograd (so the CPU implementation here still chooses kernel or reference under
the same policy, and fake/functional/batched tensors get their own handling), and its backward runs
the formulas below op for op (the fused backward op without ``create_graph``; with it, the
differentiable formula, called back in Python: ``reference/projection.py``'s ``dense_backward`` and
this package's ``_bisect_backward_reference``); ``tests/kernels/test_cpp_autograd.py`` checks that
gradients are bit-identical.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor
from torch.autograd import Function

from ..._validation import mark_not_there
from .. import cpu
from ..reference import projection as ref_projection
from ._autograd import closed_form_backward
from ..policy import triton_launchers
from ._common import empty_like_contiguous, grad_as, rows, unrows


# ---------------------------------------------------------------------------------------------
# sparsemax / 1.5-entmax (exact threshold)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::project", mutates_args=())
def project(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    """sparsemax (``kind='sparsemax'``) or 1.5-entmax (``'entmax15'``) of the rows of ``x``."""
    return ref_projection.project_sorted(x, kind)


@project.register_kernel("cpu")
def _project_cpu(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    ext = cpu.PROJECTION.kernel_for(x)
    if ext is not None and x.shape[-1] > 0:
        return unrows(ext.forward(rows(x), kind == "entmax15"), x)
    return ref_projection.project(x, -1, kind, k).contiguous()


@project.register_kernel("cuda")
def _project_cuda(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    from ..auto_plan import row_backend  # (here: plan imports this package)

    launchers = triton_launchers()
    if launchers is not None and launchers.project_supports(x) and row_backend(kind, x) == "triton":
        return launchers.project(x, kind)  # exact threshold without sorting: ``k`` has no use there
    return ref_projection.project_sorted(x, kind)


@project.register_fake
def _project_fake(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    return empty_like_contiguous(x)


@torch.library.custom_op("sparsenorm::project_backward", mutates_args=())
def project_backward(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    """The closed-form backward of :func:`project` from its output ``p``."""
    return ref_projection.dense_backward(p, grad, kind)


@project_backward.register_kernel("cpu")
def _project_backward_cpu(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    grad = grad_as(grad, p)
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is not None and p.shape[-1] > 0:
        return unrows(ext.backward(rows(p), rows(grad), kind == "entmax15"), p)
    return ref_projection.fast_backward(p.contiguous(), grad, kind)


@project_backward.register_kernel("cuda")
def _project_backward_cuda(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    from ..auto_plan import row_backend

    launchers = triton_launchers()
    if launchers is not None and launchers.project_supports(p) and row_backend(kind, p) == "triton":
        return launchers.project_backward(p, grad.to(p.dtype).expand_as(p), kind)
    return ref_projection.dense_backward(p, grad, kind)


@project_backward.register_fake
def _project_backward_fake(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    return empty_like_contiguous(p)


def _project_setup(ctx, inputs, output) -> None:
    ctx.kind = inputs[1]
    ctx.save_for_backward(output)


def _project_autograd(ctx, grad: Tensor):
    (p,) = ctx.saved_tensors
    return closed_form_backward(project_backward, ref_projection.dense_backward, p, grad, ctx.kind), None, None


project.register_autograd(_project_autograd, setup_context=_project_setup)


# ---------------------------------------------------------------------------------------------
# alpha-entmax with one alpha > 1 (entmax_bisect's common case)
# ---------------------------------------------------------------------------------------------
# The reference bisects the bracket (width < 1) n_iter times, so its tau is within 2^-n_iter of the
# root: from these counts on that is rounding (<= 4 eps), and the C++ kernel, which solves to
# rounding by safeguarded Newton, may stand in for it.
_BISECT_CONVERGED = {torch.float32: 24, torch.float64: 50}


def _alpha_rows(x: Tensor, alpha: float) -> Tensor:
    return torch.full(x.shape[:-1] + (1,), alpha, dtype=x.dtype, device=x.device)


def _bisect_reference(x: Tensor, alpha: float, n_iter: int, ensure_sum_one: bool) -> Tensor:
    # The op's input may hold entries <= finfo.min / 2 unmarked (the C++ kernel tests for them in
    # its passes, which saves the entry path a marking pass and its backward); the bisection needs -inf.
    z = mark_not_there(x)
    return ref_projection.bisect_forward(ref_projection.shift_by_max(z), _alpha_rows(z, alpha), n_iter,
                                         ensure_sum_one, False)


def _bisect_backward_reference(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    # (called by name from kernels/cpu/projection.cpp's C++ autograd under create_graph)
    return ref_projection.bisect_backward_parts(p, grad, _alpha_rows(p, alpha))[0]


@torch.library.custom_op("sparsenorm::entmax_bisect", mutates_args=())
def entmax_bisect(x: Tensor, alpha: float, n_iter: int, ensure_sum_one: bool) -> Tensor:
    """alpha-entmax (``alpha > 1``) of the rows of ``x`` by ``n_iter`` bisection steps (reference)."""
    return _bisect_reference(x, alpha, n_iter, ensure_sum_one)


@entmax_bisect.register_kernel("cpu")
def _entmax_bisect_cpu(x: Tensor, alpha: float, n_iter: int, ensure_sum_one: bool) -> Tensor:
    ext = cpu.PROJECTION.kernel_for(x)
    if ext is None or x.shape[-1] == 0 or n_iter < _BISECT_CONVERGED[x.dtype]:
        return _bisect_reference(x, alpha, n_iter, ensure_sum_one)
    return unrows(ext.bisect_forward(rows(x), alpha, ensure_sum_one), x)


@entmax_bisect.register_fake
def _entmax_bisect_fake(x: Tensor, alpha: float, n_iter: int, ensure_sum_one: bool) -> Tensor:
    return empty_like_contiguous(x)


@torch.library.custom_op("sparsenorm::entmax_bisect_backward", mutates_args=())
def entmax_bisect_backward(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    """``gppr (g - sum(g gppr) / sum(gppr))`` with ``gppr = p^(2 - alpha)`` on the support."""
    return _bisect_backward_reference(p, grad, alpha)


@entmax_bisect_backward.register_kernel("cpu")
def _entmax_bisect_backward_cpu(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return _bisect_backward_reference(p, grad, alpha)
    return unrows(ext.bisect_backward(rows(p), rows(grad_as(grad, p)), alpha), p)


@entmax_bisect_backward.register_fake
def _entmax_bisect_backward_fake(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    return empty_like_contiguous(p)


def _entmax_bisect_setup(ctx, inputs, output) -> None:
    ctx.alpha = inputs[1]
    ctx.save_for_backward(output)


def _entmax_bisect_autograd(ctx, grad: Tensor):
    (p,) = ctx.saved_tensors
    dx = closed_form_backward(entmax_bisect_backward, _bisect_backward_reference, p, grad, ctx.alpha)
    return dx, None, None, None


entmax_bisect.register_autograd(_entmax_bisect_autograd, setup_context=_entmax_bisect_setup)


# ---------------------------------------------------------------------------------------------
# The bisections no op covers: a tensor alpha (learned, with its gradient) or alpha <= 1; sparsemax
# ---------------------------------------------------------------------------------------------
class EntmaxBisectFunction(Function):
    """alpha-entmax by bisection on ``tau`` for ``p = [(alpha - 1) x - tau]_+^(1/(alpha-1))`` over
    the last dim; ``a`` is alpha per row (shape ``X.shape[:-1] + (1,)``)."""

    generate_vmap_rule = True  # forward is torch ops only, and separate from setup_context: torch.vmap works

    @staticmethod
    def forward(X: Tensor, a: Tensor, n_iter: int, ensure_sum_one: bool, maybe_softmax: bool) -> Tensor:
        return ref_projection.bisect_forward(ref_projection.shift_by_max(X), a, n_iter, ensure_sum_one,
                                             maybe_softmax)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output, inputs[1])

    @staticmethod
    def backward(ctx, dY: Tensor):
        p, a = ctx.saved_tensors
        softmax_rows = a == 1
        dX, gppr, total, on, p_on = ref_projection.bisect_backward_parts(p, dY, a)

        d_alpha = None
        if ctx.needs_input_grad[1]:
            # Correia et al. (2019), Prop. 1 (as in the entmax package). Undefined at alpha = 1
            # (0/0); returned as 0 there (documented).
            a_safe = torch.where(softmax_rows, torch.full_like(a, 2.0), a)
            S = torch.where(on, p_on * torch.log(p_on), torch.zeros_like(p))
            ent = S.sum(-1, keepdim=True)
            skewed = gppr / total
            d_alpha = dY * (p - skewed) / (a_safe - 1) ** 2 - dY * (S - skewed * ent) / (a_safe - 1)
            d_alpha = d_alpha.sum(-1, keepdim=True)
            d_alpha = torch.where(softmax_rows, torch.zeros_like(d_alpha), d_alpha)
        return dX, d_alpha, None, None, None


class SparsemaxBisectFunction(Function):
    """sparsemax by bisection on ``tau`` for ``p = [x - tau]_+`` over the last dim; backward as sparsemax."""

    generate_vmap_rule = True  # as EntmaxBisectFunction

    @staticmethod
    def forward(X: Tensor, n_iter: int, ensure_sum_one: bool) -> Tensor:
        return ref_projection.sparsemax_bisect_forward(ref_projection.shift_by_max(X), n_iter, ensure_sum_one)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (p,) = ctx.saved_tensors
        return closed_form_backward(project_backward, ref_projection.dense_backward, p, grad_output,
                                    "sparsemax"), None, None



def sparsemax_bisect_rows(rows_: Tensor, n_iter: int, ensure_sum_one: bool) -> Tensor:
    """sparsemax by bisection of the rows of ``rows_`` (:class:`SparsemaxBisectFunction`), as a plain
    function: the entry path reads its ``treats_not_there`` (an autograd ``apply`` carries none)."""
    return SparsemaxBisectFunction.apply(rows_, n_iter, ensure_sum_one)


def entmax_bisect_is_fused(alpha: Union[float, Tensor]) -> bool:
    """Whether :func:`entmax_bisect_rows` runs the op ``sparsenorm::entmax_bisect`` for this ``alpha``
    (one number ``> 1``). The op reads entries at or below ``finfo.min / 2`` as not there itself, so
    the entry path need not mark them (issue 28: that pass, a masked_fill, and its backward were
    about half of entmax_bisect's CPU time); the Function needs them marked ``-inf``."""
    return not isinstance(alpha, Tensor) and alpha > 1


def entmax_bisect_rows(rows_: Tensor, alpha: Union[float, Tensor], n_iter: int, ensure_sum_one: bool,
                       maybe_softmax: bool) -> Tensor:
    """alpha-entmax of the rows of ``rows_`` (last dim; ``alpha`` a number or per row, as the entry
    path's ``row_param`` gives it): the op where :func:`entmax_bisect_is_fused`, else
    :class:`EntmaxBisectFunction` (differentiable in a tensor ``alpha``). ``maybe_softmax``: some
    row may have ``alpha == 1`` (softmax, the limit), a static flag."""
    if entmax_bisect_is_fused(alpha):
        return entmax_bisect(rows_, float(alpha), n_iter, bool(ensure_sum_one))
    a = alpha if isinstance(alpha, Tensor) else torch.full(rows_.shape[:-1] + (1,), alpha, dtype=rows_.dtype,
                                                           device=rows_.device)
    return EntmaxBisectFunction.apply(rows_, a, n_iter, bool(ensure_sum_one), maybe_softmax)


OPS = (project, project_backward, entmax_bisect, entmax_bisect_backward)

# What the entry path need not do for these ops (``sparsenorm._validation.run_on_rows``): project reads the
# entries at or below finfo.min / 2 as not there itself; entmax_bisect_rows where it runs the fused op.
project.treats_not_there = True
sparsemax_bisect_rows.treats_not_there = False  # its Function needs them marked -inf
entmax_bisect_rows.treats_not_there = lambda params: entmax_bisect_is_fused(params["alpha"])

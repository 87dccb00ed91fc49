"""The registered operators: one ``torch.library.custom_op`` per fused operation.

Each op works on rows along the LAST dimension of its input (the entry path in
``sparsenorm._validation`` moves the normalized dimension there) and has

* a reference implementation (``kernels/reference``, pure PyTorch, sync-free) registered for
  every device;
* a CPU implementation: the fused C++ kernel (``kernels/cpu``) where it is built and allowed
  (see :func:`sparsenorm.kernels.disabled`), else the reference (or its CPU variant);
* a CUDA implementation: the Triton kernel (``kernels/triton``, extra ``[gpu]``) where triton is
  installed, the shape qualifies and kernels are allowed, else the reference;
* a fake (shape) implementation, so ``torch.compile(fullgraph=True)`` traces through it;
* its autograd formula, registered once here: closed-form from the saved output.

The normalizers call these ops and never ask which kernel runs.

C++ autograd on CPU. The Python autograd registered here costs 45-70 us per forward+backward in
Python frames (dispatcher -> generated autograd.Function -> redispatch -> CPU kernel), several
times the row work at small shapes. So the evidential and projection extensions also register, for
``ev_softmax``, ``project`` and ``entmax_bisect``, a C++ autograd kernel under the dispatch key
``AutogradCPU`` (more specific than the ``Autograd`` alias these Python formulas are registered
under): once the extension is loaded (on the first call that may use it), CPU tensors get a C++
graph node, other devices keep the Python autograd. It changes no result: its forward redispatches
to the op below autograd (so the CPU implementation here still chooses kernel or reference under
the same policy, and fake/functional/batched tensors get their own handling), and its backward runs
the formulas below op for op (the fused backward op without ``create_graph``, the differentiable
formula with it); ``tests/kernels/test_cpp_autograd.py`` checks that gradients are bit-identical.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._validation import mark_not_there
from . import cpu
from .reference import evidential as ref_evidential
from .reference import hourglass as ref_hourglass
from .reference import projection as ref_projection
from .reference import rsoftmax as ref_rsoftmax

_NEG_INF = float("-inf")


def _rows(x: Tensor) -> Tensor:
    if x.dim() == 2 and x.is_contiguous():  # the common case, without reshape's ~1.5 us of Python dispatch
        return x
    return x.reshape(-1, x.shape[-1]).contiguous()


def _like(grad: Tensor, out: Tensor) -> Tensor:
    """An incoming gradient in ``out``'s dtype and shape (broadcast); as it is in the common case,
    without the ~1.5 us of ``to`` and ``expand_as`` calls."""
    if grad.dtype == out.dtype and grad.shape == out.shape:
        return grad
    return grad.to(out.dtype).expand_as(out)


def _unrows(rows: Tensor, like: Tensor) -> Tensor:
    """A kernel's ``(rows, K)`` output in the shape of ``like`` (a 2-D ``like`` has it already)."""
    return rows if like.dim() == 2 else rows.view_as(like)


_TRITON = None  # the Triton launchers once looked up: a module, or False where triton is missing


def triton_launchers():
    """The Triton launchers for CUDA tensors, or None (triton not installed, or kernels disabled).

    Imported on the first CUDA call only, so CPU-only use never imports triton.
    """
    global _TRITON
    if _TRITON is None:
        try:
            from . import triton as launchers
        except ImportError:
            launchers = False
        _TRITON = launchers
    if not _TRITON or getattr(cpu._local, "disabled", 0):
        return None
    return _TRITON


# ---------------------------------------------------------------------------------------------
# ev-softmax: Eq. 7 (eps None or 0), Eq. 10 (eps > 0), and their log (log=True)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::ev_softmax", mutates_args=())
def ev_softmax(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    """ev-softmax of the rows of ``x`` (last dim); see ``kernels/reference/evidential.py``."""
    return ref_evidential.ev_softmax_forward(x, eps, log)


@ev_softmax.register_kernel("cpu")
def _ev_softmax_cpu(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    ext = cpu.EVIDENTIAL.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return ref_evidential.ev_softmax_forward(x, eps, log)
    if eps is None or eps == 0.0:
        kind, shift = 0, 0.0
    else:
        kind, shift = 1, ref_evidential.off_support_shift(eps)
    return _unrows(ext.ev_softmax_forward(_rows(x), kind, shift, log), x)


@ev_softmax.register_kernel("cuda")
def _ev_softmax_cuda(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    launchers = triton_launchers()
    if launchers is not None and launchers.ev_softmax_supports(x):
        return launchers.ev_softmax_forward(x, eps, log)
    return ref_evidential.ev_softmax_forward(x, eps, log)


@ev_softmax.register_fake
def _ev_softmax_fake(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _ev_softmax_setup(ctx, inputs, output) -> None:
    ctx.log = inputs[2]
    ctx.save_for_backward(output)


def _ev_softmax_backward(ctx, grad: Tensor):
    (out,) = ctx.saved_tensors
    launchers = triton_launchers() if out.is_cuda and not torch.is_grad_enabled() else None
    if launchers is not None:  # (double backward keeps the differentiable ops below)
        return launchers.ev_softmax_backward(grad, out, ctx.log), None, None
    if ctx.log:
        if not torch.is_grad_enabled():  # (double backward keeps the differentiable ops below)
            return ev_softmax_log_backward(grad.to(out.dtype).expand_as(out), out), None, None
        return _log_backward_reference(grad, out), None, None
    return torch._softmax_backward_data(grad, out, -1, out.dtype), None, None


ev_softmax.register_autograd(_ev_softmax_backward, setup_context=_ev_softmax_setup)


def _log_backward_reference(grad: Tensor, out: Tensor) -> Tensor:
    # A -inf output is constant (the entry is not there): its incoming gradient is dropped
    # before the sum, and the entry itself then gets exactly 0.
    grad = grad.masked_fill(out == _NEG_INF, 0.0)
    return torch._log_softmax_backward_data(grad, out, -1, out.dtype)


@torch.library.custom_op("sparsenorm::ev_softmax_log_backward", mutates_args=())
def ev_softmax_log_backward(grad: Tensor, out: Tensor) -> Tensor:
    """The backward of :func:`ev_softmax`'s log form from its output ``out``: ``grad - exp(out)
    sum(grad)`` over the entries whose output is not ``-inf`` (they get 0)."""
    return _log_backward_reference(grad, out)


@ev_softmax_log_backward.register_kernel("cpu")
def _ev_softmax_log_backward_cpu(grad: Tensor, out: Tensor) -> Tensor:
    ext = cpu.EVIDENTIAL.kernel_for(out)
    if ext is None or out.shape[-1] == 0:
        return _log_backward_reference(grad, out)
    return _unrows(ext.log_backward(_rows(grad), _rows(out)), out)  # one kernel, no masked copy


@ev_softmax_log_backward.register_fake
def _ev_softmax_log_backward_fake(grad: Tensor, out: Tensor) -> Tensor:
    return torch.empty_like(out, memory_format=torch.contiguous_format)


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
        return _unrows(ext.forward(_rows(x), kind == "entmax15"), x)
    return ref_projection.project(x, -1, kind, k).contiguous()


@project.register_kernel("cuda")
def _project_cuda(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    launchers = triton_launchers()
    if launchers is not None and launchers.project_supports(x):
        return launchers.project(x, kind)  # exact threshold without sorting: ``k`` has no use there
    return ref_projection.project_sorted(x, kind)


@project.register_fake
def _project_fake(x: Tensor, kind: str, k: Optional[int]) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("sparsenorm::project_backward", mutates_args=())
def project_backward(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    """The closed-form backward of :func:`project` from its output ``p``."""
    return ref_projection.dense_backward(p, grad, kind)


@project_backward.register_kernel("cpu")
def _project_backward_cpu(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    grad = _like(grad, p)
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is not None and p.shape[-1] > 0:
        return _unrows(ext.backward(_rows(p), _rows(grad), kind == "entmax15"), p)
    return ref_projection.fast_backward(p.contiguous(), grad, kind)


@project_backward.register_kernel("cuda")
def _project_backward_cuda(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    launchers = triton_launchers()
    if launchers is not None and launchers.project_supports(p):
        return launchers.project_backward(p, grad.to(p.dtype).expand_as(p), kind)
    return ref_projection.dense_backward(p, grad, kind)


@project_backward.register_fake
def _project_backward_fake(p: Tensor, grad: Tensor, kind: str) -> Tensor:
    return torch.empty_like(p, memory_format=torch.contiguous_format)


def _project_setup(ctx, inputs, output) -> None:
    ctx.kind = inputs[1]
    ctx.save_for_backward(output)


def _project_autograd(ctx, grad: Tensor):
    (p,) = ctx.saved_tensors
    if torch.is_grad_enabled():  # double backward: differentiable ops
        return ref_projection.dense_backward(p, grad, ctx.kind), None, None
    return project_backward(p, grad, ctx.kind), None, None


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
    # its passes, which saves `normalize` a marking pass and its backward); the bisection needs -inf.
    z = mark_not_there(x)
    return ref_projection.bisect_forward(ref_projection.shift_by_max(z), _alpha_rows(z, alpha), n_iter,
                                         ensure_sum_one, False)


def _bisect_backward_reference(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
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
    return _unrows(ext.bisect_forward(_rows(x), alpha, ensure_sum_one), x)


@entmax_bisect.register_fake
def _entmax_bisect_fake(x: Tensor, alpha: float, n_iter: int, ensure_sum_one: bool) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("sparsenorm::entmax_bisect_backward", mutates_args=())
def entmax_bisect_backward(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    """``gppr (g - sum(g gppr) / sum(gppr))`` with ``gppr = p^(2 - alpha)`` on the support."""
    return _bisect_backward_reference(p, grad, alpha)


@entmax_bisect_backward.register_kernel("cpu")
def _entmax_bisect_backward_cpu(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return _bisect_backward_reference(p, grad, alpha)
    return _unrows(ext.bisect_backward(_rows(p), _rows(_like(grad, p)), alpha), p)


@entmax_bisect_backward.register_fake
def _entmax_bisect_backward_fake(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    return torch.empty_like(p, memory_format=torch.contiguous_format)


def _entmax_bisect_setup(ctx, inputs, output) -> None:
    ctx.alpha = inputs[1]
    ctx.save_for_backward(output)


def _entmax_bisect_autograd(ctx, grad: Tensor):
    (p,) = ctx.saved_tensors
    if torch.is_grad_enabled():  # double backward: differentiable ops
        return _bisect_backward_reference(p, grad, ctx.alpha), None, None, None
    return entmax_bisect_backward(p, grad, ctx.alpha), None, None, None


entmax_bisect.register_autograd(_entmax_bisect_autograd, setup_context=_entmax_bisect_setup)


# ---------------------------------------------------------------------------------------------
# sparsehourglass: sparsemax(alpha(z) z) (no autograd here: sparsenorm.hourglass's Function)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::hourglass_forward", mutates_args=())
def hourglass_forward(x: Tensor, q: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(p, alpha, sum z)`` of the rows of ``x``, ``q`` of shape ``x.shape[:-1] + (1,)``; see
    ``kernels/reference/hourglass.py``."""
    return _fresh(ref_hourglass.forward(x, q), (x, q))


@hourglass_forward.register_kernel("cpu")
def _hourglass_forward_cpu(x: Tensor, q: Tensor):
    ext = cpu.PROJECTION.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        rows = lambda z: ref_projection.project(z, -1, "sparsemax")  # noqa: E731  (the CPU iteration)
        return _fresh(ref_hourglass.forward(x, q, rows), (x, q))
    return tuple(ext.hourglass_forward(x, q))  # any shape in, outputs in the op's shapes (no Python reshapes)


@hourglass_forward.register_fake
def _hourglass_forward_fake(x: Tensor, q: Tensor):
    shape = x.shape[:-1] + (1,)
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(shape), x.new_empty(shape)


@torch.library.custom_op("sparsenorm::hourglass_backward", mutates_args=())
def hourglass_backward(g: Tensor, p: Tensor, x: Tensor, alpha: Tensor, total: Tensor,
                       q: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, dL/dq per row)`` of :func:`hourglass_forward` from its outputs."""
    return _fresh(ref_hourglass.backward(g, p, x, alpha, total, q), (g, p, x, alpha, total, q))


@hourglass_backward.register_kernel("cpu")
def _hourglass_backward_cpu(g, p, x, alpha, total, q):
    ext = cpu.PROJECTION.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return _fresh(ref_hourglass.backward(g, p, x, alpha, total, q), (g, p, x, alpha, total, q))
    return tuple(ext.hourglass_backward(g, p, x, alpha, total, q))


@hourglass_backward.register_fake
def _hourglass_backward_fake(g, p, x, alpha, total, q):
    return torch.empty_like(p, memory_format=torch.contiguous_format), alpha.new_empty(alpha.shape)


# ---------------------------------------------------------------------------------------------
# r-softmax: the quantile threshold (no autograd here: RSoftmaxFunction's closed form uses it)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::r_softmax_threshold", mutates_args=())
def r_softmax_threshold(x: Tensor, r: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(tau, lo_idx, hi_idx, frac, dtau_dr)`` of each row; see ``kernels/reference/rsoftmax.py``."""
    return ref_rsoftmax.quantile_threshold_sorted(x, r)


@r_softmax_threshold.register_kernel("cpu")
def _r_softmax_threshold_cpu(x: Tensor, r: Tensor):
    tau, *rest = ref_rsoftmax.quantile_threshold(x, r)
    rest = [t.expand(tau.shape) if isinstance(t, Tensor) else torch.full_like(tau, t) for t in rest]
    return _fresh((tau, *rest), (x, r))


def _fresh(outs, inputs):
    """Outputs as fresh contiguous tensors: an op's outputs may alias neither its inputs nor each other."""
    fresh, seen = [], {t.untyped_storage().data_ptr() for t in inputs}
    for t in outs:
        if t.untyped_storage().data_ptr() in seen or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
        seen.add(t.untyped_storage().data_ptr())
        fresh.append(t)
    return tuple(fresh)


@r_softmax_threshold.register_fake
def _r_softmax_threshold_fake(x: Tensor, r: Tensor):
    shape = x.shape[:-1] + (1,)
    value = x.new_empty(shape)
    index = x.new_empty(shape, dtype=torch.long)
    return value, index, index.clone(), value.clone(), value.clone()


@torch.library.custom_op("sparsenorm::r_softmax_forward", mutates_args=())
def r_softmax_forward(x: Tensor, r: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """r-softmax of the rows of ``x`` with ``r`` of shape ``x.shape[:-1] + (1,)``:
    ``(p, tau, lo_idx, hi_idx, frac, dtau_dr, dead)``; no autograd here (``RSoftmaxFunction``)."""
    return _fresh(ref_rsoftmax.forward(x, r, sorted_threshold=True), (x, r))


@r_softmax_forward.register_kernel("cpu")
def _r_softmax_forward_cpu(x: Tensor, r: Tensor):
    ext = cpu.RSOFTMAX.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return _fresh(ref_rsoftmax.forward(x, r, sorted_threshold=False), (x, r))
    return tuple(ext.forward(x, r))  # any shape in, outputs in the op's shapes (no Python reshapes)


@r_softmax_forward.register_fake
def _r_softmax_forward_fake(x: Tensor, r: Tensor):
    shape = x.shape[:-1] + (1,)
    index = x.new_empty(shape, dtype=torch.long)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(shape), index,
            index.clone(), x.new_empty(shape), x.new_empty(shape), x.new_empty(shape, dtype=torch.bool))


@torch.library.custom_op("sparsenorm::t_softmax_forward", mutates_args=())
def t_softmax_forward(x: Tensor, t: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """t-softmax of the rows of ``x`` with ``t`` of shape ``x.shape[:-1] + (1,)``:
    ``(p, tau, argmax, dead)``; its backward is :func:`r_softmax_backward` with ``lo_idx = hi_idx
    = argmax`` and ``frac = 0`` (no autograd here: ``TSoftmaxFunction``)."""
    return _fresh(ref_rsoftmax.t_forward(x, t), (x, t))


@t_softmax_forward.register_kernel("cpu")
def _t_softmax_forward_cpu(x: Tensor, t: Tensor):
    ext = cpu.RSOFTMAX.kernel_for(x)
    if ext is None or x.shape[-1] == 0:
        return _fresh(ref_rsoftmax.t_forward(x, t), (x, t))
    return tuple(ext.t_forward(x, t))


@t_softmax_forward.register_fake
def _t_softmax_forward_fake(x: Tensor, t: Tensor):
    shape = x.shape[:-1] + (1,)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(shape),
            x.new_empty(shape, dtype=torch.long), x.new_empty(shape, dtype=torch.bool))


@torch.library.custom_op("sparsenorm::r_softmax_backward", mutates_args=())
def r_softmax_backward(g: Tensor, p: Tensor, x: Tensor, tau: Tensor, lo_idx: Tensor, hi_idx: Tensor,
                       frac: Tensor, dead: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dL/dx, C)`` of r-softmax from the forward's outputs; ``dL/dr = C dtau_dr``. Also
    t-softmax's (``lo_idx = hi_idx = argmax``, ``frac = 0``; ``dL/dt = -C``)."""
    return ref_rsoftmax.backward(g.contiguous(), p, x, tau, lo_idx, hi_idx, frac, dead)


@r_softmax_backward.register_kernel("cpu")
def _r_softmax_backward_cpu(g, p, x, tau, lo_idx, hi_idx, frac, dead):
    ext = cpu.RSOFTMAX.kernel_for(p)
    if ext is None or p.shape[-1] == 0:
        return ref_rsoftmax.backward(g.contiguous(), p, x, tau, lo_idx, hi_idx, frac, dead)
    return tuple(ext.backward(g, p, x, tau, lo_idx, hi_idx, frac, dead))


@r_softmax_backward.register_fake
def _r_softmax_backward_fake(g, p, x, tau, lo_idx, hi_idx, frac, dead):
    return torch.empty_like(p, memory_format=torch.contiguous_format), tau.new_empty(tau.shape)


# ---------------------------------------------------------------------------------------------
# vmap: every op above works row by row along the last dim, and each tensor argument has the
# input's leading dims (per-row parameters have a last dim of 1; a backward's incoming gradient may
# broadcast). So the vmapped dim is just more rows: move it to the front of every tensor argument
# (expanding an unbatched one), call the op once, and its outputs are batched along dim 0. Without
# this rule torch.vmap falls back to one call per batch entry (slow, with a warning). Gradients: take
# them with ordinary autograd outside vmap (what experiments/_shared/stacking.py does); torch.func.grad
# through a custom op is refused by torch 2.13 (torch.library's generated autograd.Function has no
# setup_context; the C++ autograd kernels on CPU are torch::autograd::Functions, refused as well). The autograd.Functions around these ops (r-/t-softmax, sparsehourglass, the bisections)
# let torch generate their vmap rules from these.
# ---------------------------------------------------------------------------------------------
def _rowwise_vmap_rule(op):
    def rule(info, in_dims, *args):
        tensors = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        rank = max(args[i].dim() - (in_dims[i] is not None) for i in tensors)  # the largest per-entry rank
        batched = list(args)
        for i in tensors:
            t, dim = args[i], in_dims[i]
            t = t.unsqueeze(0).expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
            # a broadcast argument of lower rank keeps broadcasting: its missing leading dims go after the batch dim
            batched[i] = t[(slice(None),) + (None,) * (rank - (t.dim() - 1))]
        out = op(*batched)
        return out, (tuple(0 for _ in out) if isinstance(out, tuple) else 0)

    torch.library.register_vmap(op, rule)


for _op in (ev_softmax, ev_softmax_log_backward, project, project_backward, entmax_bisect, entmax_bisect_backward,
            hourglass_forward, hourglass_backward, r_softmax_threshold, r_softmax_forward, t_softmax_forward,
            r_softmax_backward):
    _rowwise_vmap_rule(_op)


__all__ = ["ev_softmax", "ev_softmax_log_backward", "project", "project_backward", "entmax_bisect", "entmax_bisect_backward", "hourglass_forward", "hourglass_backward", "r_softmax_threshold", "r_softmax_forward",
           "t_softmax_forward", "r_softmax_backward"]

"""Training an experiment's seeds side by side: S copies of one model as one stacked network per step.

A seed's run is (its initialisation, its data order, its noise, its optimizer state). Small models on
CPU spend most of a step in per-op overhead, not arithmetic, so S runs of one model cost nearly S
times one run's overhead; trained as one network whose every parameter has a leading dim of S
(:func:`torch.func.stack_module_state`), called per copy with :func:`torch.func.functional_call`
under :func:`torch.vmap`, they share that overhead and each op becomes one batched op.

Why each copy's trajectory is its own (the same as training it alone, up to float rounding):

* **Initialisation**: each copy is an ordinary module built after seeding with its own seed, then
  stacked; copy ``s`` starts from exactly the parameters a run alone would have.
* **Data order and noise**: drawn per copy from the copy's own generator, in the order a run alone
  draws them, outside the vmapped function, and passed in as batched inputs (vmapped code draws no
  random numbers: ``torch.vmap``'s default ``randomness="error"`` enforces it).
* **Gradients**: the step minimises the *sum* of the S losses. Copy ``s``'s parameters enter only
  copy ``s``'s loss, so the gradient of the sum with respect to them is that loss's gradient alone.
* **Optimizer**: SGD and Adam (with or without momentum and weight decay) update every parameter
  element from that element's own gradient and state, so one optimizer over the stacked parameters
  performs each copy's own update. What is *not* elementwise must be done per copy: gradient-norm
  clipping (:func:`clip_grad_norm_per_copy`; ``torch.nn.utils.clip_grad_norm_`` would use the norm
  over all copies together) and any learning-rate schedule that reads a loss (one per copy, or none).
  A loss averaged over copies would divide every copy's gradient by S, which Adam hides and SGD does
  not: sum, never mean.

What differs is rounding: a batched matmul may sum in another order than S separate ones (see the
tests, ``tests/experiments/test_stacking.py``, for the error model).

The normalizers' registered ops carry a vmap rule (``sparsenorm.kernels.ops``: the vmapped dim is
more rows), so a stacked forward calls each op once. Evaluation can read one copy back as an ordinary
module (:meth:`StackedModels.copy`).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterator, Sequence

import torch
from torch import Tensor, nn


class _Apply(nn.Module):
    """Holds the model so that ``functional_call`` can swap in one copy's parameters and call ``fn(model, ...)``:
    any method of the model, not only ``forward``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.model, *args)


class StackedModels:
    """S structurally equal modules trained as one: ``params[name]`` has shape ``(S, *shape)``.

    ``models`` are the copies as initialised (one per seed); they are not modified and need not be
    kept. ``parameters()`` are the leaves to give one optimizer.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        if len(models) < 1:
            raise ValueError("StackedModels needs at least one model")
        names = [sorted(dict(m.named_parameters())) for m in models]
        if any(n != names[0] for n in names):
            raise ValueError("StackedModels: the models must have the same parameter names")
        self.size = len(models)
        params, buffers = torch.func.stack_module_state(list(models))
        # A copy's matrix W (out, in) is used as x @ W^T; under vmap its gradient comes out of a batched
        # matmul as the transpose of a contiguous (S, in, out) tensor. Laid out that way from the start, the
        # gradient is accumulated as it comes instead of being copied into (S, out, in) order every step
        # (measured: about a fifth of a stacked CVAE step on CPU). Values and results are unchanged.
        self.params: Dict[str, Tensor] = {
            name: p.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() if p.dim() == 3 else p
            for name, p in params.items()}
        self.buffers: Dict[str, Tensor] = buffers
        # The holder of the structure: its own parameters are never used (functional_call swaps them).
        self._apply = _Apply(copy.deepcopy(models[0]).to("meta"))

    def parameters(self) -> Iterator[Tensor]:
        return iter(self.params.values())

    def __call__(self, fn: Callable[..., Any], *batched: Tensor) -> Any:
        """``fn(model_s, *inputs_s)`` for every copy ``s`` at once: each input has a leading dim of S
        (``inputs_s = input[s]``); every output gains a leading dim of S.

        ``fn`` must be a function of the model and tensors that draws no random numbers (pass noise
        in as an input, drawn from each copy's generator).
        """
        state = {**{f"model.{k}": v for k, v in self.params.items()},
                 **{f"model.{k}": v for k, v in self.buffers.items()}}

        def one(state_s: Dict[str, Tensor], *inputs_s: Tensor) -> Any:
            return torch.func.functional_call(self._apply, state_s, (fn, *inputs_s))

        return torch.vmap(one)(state, *batched)

    @torch.no_grad()
    def copy(self, index: int, into: nn.Module) -> nn.Module:
        """Copy ``index``'s current parameters and buffers into ``into`` (a module of the same structure); return it."""
        if not 0 <= index < self.size:
            raise IndexError(f"copy index {index} out of range for {self.size} stacked models")
        state = {k: v[index] for k, v in {**self.params, **self.buffers}.items()}
        into.load_state_dict(state)
        return into


@torch.no_grad()
def clip_grad_norm_per_copy(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each copy of stacked parameters on its own: copy ``s``'s
    gradients (``p.grad[s]`` of every ``p``) are scaled by ``min(1, max_norm / (norm_s + 1e-6))``, ``norm_s``
    the 2-norm over copy ``s``'s gradients only. Returns the S norms before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("clip_grad_norm_per_copy: no parameter has a gradient")
    norms = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in grads]).norm(dim=0)  # (S,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # the same formula as clip_grad_norm_
    for g in grads:
        g.mul_(scale.reshape((-1,) + (1,) * (g.dim() - 1)))
    return norms

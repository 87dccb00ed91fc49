"""sparsenorm: sparse probability-mapping functions for PyTorch.

Functional API at the top level, one ``nn.Module`` per function; losses in ``sparsenorm.losses``
(re-exported here); every normalizer by name in ``sparsenorm.registry``; the kernel layer in
``sparsenorm.kernels``. ``sparsenorm.registry``, ``sparsenorm.attention``, ``sparsenorm.hf`` and
``sparsenorm.marginalize`` are importable as attributes (loaded on first access).
"""
import importlib as _importlib
from .evidential import (
    EvSoftmax,
    EvSoftmaxTrain,
    LogEvSoftmaxTrain,
    PosthocEvidential,
    ev_softmax,
    ev_softmax_train,
    log_ev_softmax_train,
    posthoc_evidential,
)
from . import kernels
from .kernels import use_cpu_kernels
from .hourglass import SparseHourglass, sparsehourglass
from .rsoftmax import RSoftmax, TSoftmax, r_softmax, t_softmax
from .entmax import (
    Entmax15,
    EntmaxBisect,
    Sparsemax,
    SparsemaxBisect,
    entmax15,
    entmax_bisect,
    sparsemax,
    sparsemax_bisect,
)
from .losses import *  # noqa: F401,F403  (the loss functions and modules, listed in losses.__all__)
from .losses import __all__ as _loss_names
from .linear_loss import FusedLinearLoss, fused_linear_loss

__version__ = "0.1.0"

__all__ = [
    "ev_softmax", "ev_softmax_train", "log_ev_softmax_train", "posthoc_evidential",
    "EvSoftmax", "EvSoftmaxTrain", "LogEvSoftmaxTrain", "PosthocEvidential",
    "sparsemax", "sparsemax_bisect", "entmax15", "entmax_bisect",
    "Sparsemax", "SparsemaxBisect", "Entmax15", "EntmaxBisect",
    "t_softmax", "r_softmax", "TSoftmax", "RSoftmax",
    "sparsehourglass", "SparseHourglass",
    "use_cpu_kernels", "kernels",
    "marginalize",  # noqa: F405  (a lazy submodule: __getattr__ below)
    "fused_linear_loss", "FusedLinearLoss",
    *_loss_names,
]

_LAZY_SUBMODULES = ("registry", "attention", "hf", "marginalize", "demo", "cli", "experiments")


def __getattr__(name: str):
    """``sparsenorm.registry`` (and the other submodules above) without an explicit import."""
    if name in _LAZY_SUBMODULES:
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

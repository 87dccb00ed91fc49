"""Losses for every normalizer, with ``torch.nn.CrossEntropyLoss``'s conventions."""
from .evidential import (
    EvSoftmaxNLLLoss,
    ev_softmax_kl_div,
    ev_softmax_multilabel_loss,
    ev_softmax_nll_loss,
)
from .fenchel_young import (
    Entmax15Loss,
    EntmaxBisectLoss,
    SparsemaxBisectLoss,
    SparsemaxLoss,
    entmax15_loss,
    entmax_bisect_loss,
    sparsemax_bisect_loss,
    sparsemax_loss,
)
from .hourglass import (
    SparseHourglassHingeLoss,
    SparseHourglassMultilabelHingeLoss,
    sparsehourglass_hinge_loss,
    sparsehourglass_multilabel_hinge_loss,
)
from .rsoftmax import (
    RSoftmaxLoss,
    SparsityRatePredictor,
    TSoftmaxLoss,
    r_softmax_loss,
    t_softmax_loss,
)

__all__ = [
    "ev_softmax_nll_loss", "EvSoftmaxNLLLoss", "ev_softmax_kl_div", "ev_softmax_multilabel_loss",
    "sparsemax_loss", "SparsemaxLoss", "sparsemax_bisect_loss", "SparsemaxBisectLoss",
    "entmax15_loss", "Entmax15Loss", "entmax_bisect_loss", "EntmaxBisectLoss",
    "sparsehourglass_hinge_loss", "SparseHourglassHingeLoss",
    "sparsehourglass_multilabel_hinge_loss", "SparseHourglassMultilabelHingeLoss",
    "r_softmax_loss", "RSoftmaxLoss", "t_softmax_loss", "TSoftmaxLoss", "SparsityRatePredictor",
]

"""Multi-label classification: the r-softmax paper's Sec. 4.1 (Fig. 2, Table 1) and the sparsemax
paper's multi-label study, with ev-softmax added.

The output layer's support is the predicted label set: a sparse normalizer needs no threshold,
softmax needs a threshold p0 and per-label sigmoids a 0.5 cut. One file per job: :mod:`.data`
(synthetic generator, yeast, the user's files), :mod:`.methods` (network, losses, predictions),
:mod:`.train` (one data set and seed), :mod:`.claims` (summaries and verdicts), :mod:`.report`
(figures and tables), :mod:`.experiment` (settings and the runner's ``EXPERIMENT``).
"""
from .experiment import EXPERIMENT, Settings

__all__ = ["EXPERIMENT", "Settings"]

"""The ev-softmax paper's Table 2 (semi-supervised VAE) and this experiment's defaults and run modes: a
leaf module (imports nothing of the experiment), shared by the experiment, its claims and its report."""
from typing import Dict, Tuple

PAPER = "ev-softmax (Chen et al. 2021), Sec. 4.2, Table 2, App. E.2"
DEFAULT_NORMALIZERS = ["softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax", "r_softmax"]

PAPER_NORMALIZERS = ["softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax"]
SOURCE = "Sec. 4.2, Table 2"

# Table 2 (Monte Carlo rows, from Correia et al.): accuracy in %; decoder calls 1.
PAPER_ACCURACY: Dict[str, Tuple[float, float]] = {"sfe": (94.75, 0.2), "nvil": (96.01, 0.2), "gumbel": (95.46, 0.1),
                                                  "st_gumbel": (86.35, 0.6), "sfe_plus": (96.53, 0.1),
                                                  "sum_and_sample": (96.73, 0.1)}
"""Mean and standard error in % (the paper prints "± .002" etc. as fractions)."""
ONE_CALL_ESTIMATORS = ("sfe", "nvil", "gumbel", "st_gumbel")
"""Table 2's Monte-Carlo rows with one decoder call per example (``ev.ssvae.beats_monte_carlo``)."""
TWO_CALL_ESTIMATORS = ("sfe_plus", "sum_and_sample")
"""Table 2's rows with two decoder calls per example (``ev.ssvae.sum_and_sample``)."""

# Table 2 (marginalisation rows): accuracy in %, decoder calls per example.
PAPER_TABLE2 = {
    "softmax": {"accuracy": 96.93, "accuracy_se": 0.1, "decoder_calls": 10.0, "decoder_calls_se": 0.0},
    "sparsemax": {"accuracy": 96.87, "accuracy_se": 0.1, "decoder_calls": 1.01, "decoder_calls_se": 0.01},
    "entmax15": {"accuracy": 97.20, "accuracy_se": 0.1, "decoder_calls": 1.01, "decoder_calls_se": 0.01},
    "posthoc_evidential": {"accuracy": 96.90, "accuracy_se": 0.1, "decoder_calls": 1.72, "decoder_calls_se": 0.05},
    "ev_softmax": {"accuracy": 97.30, "accuracy_se": 0.1, "decoder_calls": 1.64, "decoder_calls_se": 0.01},
}
PAPER_TABLE2.update({name: {"accuracy": acc, "accuracy_se": se, "decoder_calls": 2.0 if name in TWO_CALL_ESTIMATORS
                            else 1.0, "decoder_calls_se": 0.0} for name, (acc, se) in PAPER_ACCURACY.items()})  # its Monte-Carlo rows

FULL = dict(epochs=200, seeds=10, pretrain_epochs=100, steps_per_epoch=None, selection_examples=None)
QUICK = dict(epochs=3, seeds=2, pretrain_epochs=10, steps_per_epoch=100, selection_examples=2000)
DECISIVE = dict(epochs=10, seeds=6, pretrain_epochs=20, steps_per_epoch=200, selection_examples=2000)

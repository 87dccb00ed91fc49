"""Metrics shared by the experiments (plain functions on numpy arrays or tensors)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
from scipy.stats import wasserstein_distance

def _as_distribution(p, what: str) -> np.ndarray:
    arr = np.asarray(p.detach().cpu() if hasattr(p, "detach") else p, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one distribution (1-D), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any() or arr.sum() <= 0:
        raise ValueError(f"{what} must be finite, non-negative and not all zero")
    return arr


def _two_distributions(p, q) -> Tuple[np.ndarray, np.ndarray]:
    """``p`` and ``q`` as distributions over the same classes (checked)."""
    p, q = _as_distribution(p, "p"), _as_distribution(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same number of classes, got {p.shape} and {q.shape}")
    return p, q


def class_wasserstein(p, q, positions: Optional[Sequence[float]] = None) -> float:
    """1-Wasserstein distance between two distributions over the same ordered classes.

    The classes sit at ``positions`` (default 0, 1, ..., K-1, i.e. the digit values) and the
    probabilities are the weights: ``scipy.stats.wasserstein_distance(pos, pos, p, q)``. (Passing
    the probabilities as the *values* would compare the two sets of numbers, ignoring which class
    carries which probability.) Weights are normalized by scipy, so unnormalized inputs are fine.
    """
    p, q = _two_distributions(p, q)
    pos = np.arange(len(p), dtype=np.float64) if positions is None else np.asarray(positions, dtype=np.float64)
    if pos.shape != p.shape:
        raise ValueError(f"positions must have one entry per class, got {pos.shape} for {p.shape}")
    return float(wasserstein_distance(pos, pos, p, q))


def authors_wasserstein(p, q) -> float:
    """The distance of the ev-softmax authors' plotting script (sisl/EvSoftmax, ``mnist_cvae/plot_dists.py``).

    ``scipy.stats.wasserstein_distance(p, q)``: the probabilities are the *values* of two samples,
    so it compares the two sets of numbers and ignores which class carries which probability (five
    equal modes on the wrong digits score 0 against five equal modes on the right ones). Kept to
    compare with the paper's Fig. 3; :func:`class_wasserstein` is the distance between the
    distributions.
    """
    p, q = _two_distributions(p, q)
    return float(wasserstein_distance(p, q))


def parity_mass(prior, decoded_digits, parity: str) -> float:
    """Probability mass that ``prior`` (over latent classes) puts on classes whose decoded digit has ``parity``.

    ``decoded_digits[k]`` is the digit the classifier reads in the image decoded from latent class
    k. 1 means the prior only generates digits of the right parity (ev-softmax paper, Sec. 4.1).
    """
    if parity not in ("even", "odd"):
        raise ValueError(f"parity must be 'even' or 'odd', got {parity!r}")
    prior = _as_distribution(prior, "prior")
    digits = np.asarray(decoded_digits)
    if digits.shape != prior.shape:
        raise ValueError(f"decoded_digits must have one digit per latent class, got {digits.shape} for {prior.shape}")
    right = digits % 2 == (0 if parity == "even" else 1)
    return float(prior[right].sum() / prior.sum())


def parity_target(parity: str) -> np.ndarray:
    """The ground-truth digit distribution of a query: uniform over the five even or odd digits."""
    if parity not in ("even", "odd"):
        raise ValueError(f"parity must be 'even' or 'odd', got {parity!r}")
    target = np.zeros(10)
    target[0 if parity == "even" else 1::2] = 0.2
    return target


def marginal_digit_distribution(prior, classifier_probs) -> np.ndarray:
    """``sum_k Q(digit | x_k) p(z_k | y)``: the digit distribution a prior induces.

    ``prior`` is ``(..., K)`` (p(z | y) per query), ``classifier_probs`` ``(K, 10)`` (the digit
    classifier's distribution for the image decoded from each latent class). Ev-softmax paper,
    Appendix E.1.
    """
    prior = np.asarray(prior, dtype=np.float64)
    classifier_probs = np.asarray(classifier_probs, dtype=np.float64)
    return prior @ classifier_probs


def nonzero_count(probs, threshold: float = 0.0) -> np.ndarray:
    """Entries with probability above ``threshold`` (exact nonzeros by default), per row."""
    return (np.asarray(probs) > threshold).sum(axis=-1)


# --- multi-label classification (sparsenorm.experiments.rsoftmax_multilabel) ---------------------
# Label sets are 0/1 (or boolean) arrays of shape (n_examples, n_labels). Where a ratio is 0/0
# (an example with no true and no predicted label; a label never true nor predicted; no positives
# at all for micro-F1) the score is ``zero_division``, as in scikit-learn's ``f1_score``
# (whose default, "warn", counts it as 0).


def _label_sets(y_true, y_pred) -> tuple:
    t = np.asarray(y_true.detach().cpu() if hasattr(y_true, "detach") else y_true)
    p = np.asarray(y_pred.detach().cpu() if hasattr(y_pred, "detach") else y_pred)
    if t.ndim != 2 or t.shape != p.shape:
        raise ValueError(f"y_true and y_pred must be 2-D of the same shape, got {t.shape} and {p.shape}")
    for name, arr in (("y_true", t), ("y_pred", p)):
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must contain only 0/1 (or booleans)")
    return t.astype(bool), p.astype(bool)


def _f1_from_counts(tp, n_true, n_pred, zero_division: float) -> np.ndarray:
    tp, denom = np.asarray(tp, dtype=np.float64), np.asarray(n_true + n_pred, dtype=np.float64)
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), zero_division)


def example_f1(y_true, y_pred, zero_division: float = 0.0) -> float:
    """Example-based (``average='samples'``) F1: the mean over examples of
    ``2 |T_i ∩ P_i| / (|T_i| + |P_i|)`` for true label set T_i and predicted set P_i."""
    t, p = _label_sets(y_true, y_pred)
    return float(_f1_from_counts((t & p).sum(1), t.sum(1), p.sum(1), zero_division).mean())


def micro_f1(y_true, y_pred, zero_division: float = 0.0) -> float:
    """Micro-averaged F1: ``2 TP / (2 TP + FP + FN)`` over all (example, label) pairs."""
    t, p = _label_sets(y_true, y_pred)
    return float(_f1_from_counts((t & p).sum(), t.sum(), p.sum(), zero_division))


def macro_f1(y_true, y_pred, zero_division: float = 0.0) -> float:
    """Macro-averaged F1: the unweighted mean over labels of each label's F1."""
    t, p = _label_sets(y_true, y_pred)
    return float(_f1_from_counts((t & p).sum(0), t.sum(0), p.sum(0), zero_division).mean())


def mean_set_size(y) -> float:
    """Average number of labels per example (of a true or a predicted label matrix)."""
    arr = np.asarray(y.detach().cpu() if hasattr(y, "detach") else y)
    if arr.ndim != 2:
        raise ValueError(f"expected a 2-D label matrix, got shape {arr.shape}")
    return float(arr.astype(bool).sum(1).mean())


def multilabel_scores(y_true, y_pred, zero_division: float = 0.0) -> dict:
    """Example-based, micro and macro F1 plus predicted and true average set sizes."""
    return {
        "example_f1": example_f1(y_true, y_pred, zero_division),
        "micro_f1": micro_f1(y_true, y_pred, zero_division),
        "macro_f1": macro_f1(y_true, y_pred, zero_division),
        "mean_set_size": mean_set_size(y_pred),
        "true_mean_set_size": mean_set_size(y_true),
    }

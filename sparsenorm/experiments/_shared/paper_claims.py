"""The record of one claim of the three papers, and the claims that no experiment owns.

The catalogue of every claim is gathered by :mod:`sparsenorm.experiments.catalogue`: each experiment's
claims, with the paper's values built from its tables, in its own ``paper.py`` (``PAPER_CLAIMS``), and here
the properties of functions the test suite checks, the cost claim the benchmark measures and the claim no
experiment runs. Each :class:`PaperClaim` says where the paper makes the claim, the paper's value, and how sparsenorm
addresses it: an experiment that judges it (its :class:`~.verdict.Claim` carries the same ``key``,
so the index of :mod:`.paper_index` finds the verdict in the committed ``results.json`` files), the
test suite (a property of a function, not an experiment), or nothing yet, with the reason and what
running it would take. A claim that no experiment runs appears in the index as *not run*, so a
reader can tell "not reproduced" from "never tried".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

EV = "ev-softmax (Chen et al., NeurIPS 2021)"
RS = "r-softmax (Bałazy et al. 2023)"
SM = "sparsemax (Martins & Astudillo, ICML 2016)"


@dataclass(frozen=True)
class PaperClaim:
    key: str
    paper: str
    where: str
    claim: str
    paper_value: str
    experiment: Optional[str] = None
    """The ``sparsenorm reproduce`` experiment that judges it; None when no experiment does."""
    tests: str = ""
    """For a property of a function: the tests that check it (no experiment verdict)."""
    measured: str = ""
    """For a cost claim: the committed benchmark that measures it (no experiment verdict)."""
    not_run: str = ""
    """Why no experiment judges it, and what running it would take."""
    caveat: str = ""
    """What the judging run leaves out that bears on this claim, said beside its verdict in the index."""
    quote: str = ""
    """For a claim an experiment judges: the paper's own sentence that makes it, verbatim from the text in
    ``shared/papers/`` (or, where the extract lacks the section, what the extract does say, and that it lacks it)."""
    primary: str = ""
    """For a claim an experiment judges: the comparison that sentence states, which the experiment judges as the
    primary part (the rivals it names, all of them when it names a group or says "highest of"/"best"; a further
    clause, another metric or a row the sentence does not name is secondary). Judged so by the experiment's
    ``claims.py``; the judged claim's evidence names its primary parts."""


EV_THEORY: Tuple[PaperClaim, ...] = (
    PaperClaim("ev.fig1_example", EV, "Fig. 1, slides",
               "worked examples: ev-softmax((0.4, 1.4, -0.8)) ≈ (0.27, 0.73, 0) "
               "is bimodal where sparsemax gives (0, 1, 0)", "(0.27, 0.73, 0)",
               tests="tests/unit/test_evidential.py::test_fig1_values_to_three_decimals, "
                     "::test_worked_examples_match_literal_formula_and_printed_numbers; `sparsenorm demo`"),
    PaperClaim("ev.table1_properties", EV, "Table 1, App. C", "ev-softmax is monotonic, translation- and "
               "permutation-invariant, full-domain, and neither idempotent nor scale-invariant (as softmax)",
               "Table 1 check marks",
               tests="tests/unit/test_evidential.py::test_monotonic, ::test_translation_invariant, "
               "::test_permutation_invariant, ::test_full_domain, ::test_not_idempotent_and_not_scale_invariant; "
               "`sparsenorm demo` checks the whole table numerically"),
    PaperClaim("ev.gradient", EV, "Eq. 9, Eq. 12, App. D", "closed-form Jacobian of ev-softmax; the gradient of the "
               "log of the training form tends to delta - ev-softmax", "Eqs. 9, 12",
               tests="tests/unit/test_evidential.py::test_eq9_jacobian, "
                     "::test_eq12_gradient_of_log_train_tends_to_delta_minus_ev_softmax, "
                     "::test_gradcheck_and_gradgradcheck"),
    PaperClaim("ev.posthoc_equivalence", EV, "Theorem 3.1, App. B", "post-hoc evidential sparsification of a linear "
               "layer's output equals ev-softmax", "Theorem 3.1",
               tests="tests/unit/test_evidential.py::test_theorem_3_1_posthoc_equals_ev_softmax, "
                     "::test_singleton_masses_match_dempsters_rule_by_brute_force"),
)
"""ev-softmax's properties of a function, checked by the test suite."""

R_THEORY: Tuple[PaperClaim, ...] = (
    PaperClaim("r.rate_exact", RS, "Sec. 3, Eq. 2-3", "r-softmax gives a fraction r of zeros (the sparsity rate) and "
               "is a probability distribution; t-softmax with a learnable t", "definition",
               tests="tests/unit/test_rsoftmax.py::test_properties and the rest of tests/unit/test_rsoftmax.py"),
    PaperClaim("r.zero_is_softmax", RS, "Sec. 1", "for a sparsity rate r = 0, r-softmax is the classical softmax",
               "stated in the introduction",
               tests="tests/unit/test_rsoftmax.py::test_r_softmax_at_zero_still_zeroes_the_"
               "minimum: under the paper's own Eq. 3 the threshold at r = 0 comes from the quantile 0, the minimum, "
               "whose weight is then zero, so r = 0 still zeroes the smallest entry and the statement is false as "
               "written; softmax is only the limit t -> infinity of t-softmax (Theorem 1, "
               "::test_t_softmax_theorem_1)"),
    PaperClaim("r.loss", RS, "Sec. 3, Eq. 4", "the multi-label loss of Eq. 4 trains r-softmax", "Eq. 4",
               tests="tests/unit/test_rsoftmax_losses.py"),
)
"""r-softmax's definition and loss, checked by the test suite."""

SM_THEORY: Tuple[PaperClaim, ...] = (
    PaperClaim("sm.properties", SM, "Sec. 2, Prop. 1-2", "sparsemax is the Euclidean projection onto the simplex, "
               "translation-invariant, permutation-equivariant, monotonic, idempotent; closed-form threshold; "
               "rho(0) = 1/K and, as the temperature goes to zero, uniform on the argmax (for sparsemax exactly, "
               "for every eps <= gamma(z) |A(z)|)",
               "Prop. 1-2", tests="tests/unit/test_sparsemax.py::test_property_* (hypothesis), checked against the "
                                  "entmax package; Prop. 2.1 (rho(0), the zero-temperature limit and sparsemax's "
                                  "bound): tests/experiments/test_paper_properties.py::test_prop2_*"),
    PaperClaim("sm.jacobian", SM, "Sec. 2.5", "the Jacobian is diag(s) - s s^T / |S|", "closed form",
               tests="tests/unit/test_sparsemax.py::test_gradients_match_entmax_package, ::test_gradcheck_exact"),
    PaperClaim("sm.loss", SM, "Sec. 3", "the sparsemax loss is convex, differentiable, zero iff sparsemax(z) = "
               "delta_k; its binary case is the modified Huber loss", "Prop. 3-4",
               tests="tests/unit/test_fenchel_young.py::test_sparsemax_loss_binary_is_modified_huber and the rest of "
                     "that file"),
    PaperClaim("sm.two_class_hard_sigmoid", SM, "Sec. 2.2", "in two dimensions sparsemax is a \"hard\" sigmoid: "
               "sparsemax([t, 0])_1 = clip((t + 1) / 2, 0, 1)", "closed form",
               tests="tests/unit/test_sparsemax.py::test_two_class_closed_form"),
    PaperClaim("sm.cost", SM, "Sec. 2.1-2.3", "sparsemax is evaluated exactly by a sort (O(K log K)) or by selection "
               "(O(K)), and its Jacobian-vector product costs O(|S|)", "complexity bounds",
               measured="benchmarks/results/cpu_normalizers.json (`make bench`; tables in benchmarks/README.md): "
                        "sparsemax forward+backward at 0.94-1.94x softmax's time at 4096 x 128 and within its targets "
                        "on long rows (256 x 32000, 16384 x 512)"),
)
"""sparsemax's properties, checked by the test suite, and its cost, measured by the benchmark."""

SM_NOT_RUN: Tuple[PaperClaim, ...] = (
    PaperClaim("sm.snli_attention", SM, "Sec. 4.3",
               "sparsemax attention in an LSTM NLI model on SNLI: similar accuracy "
               "to softmax, far more compact attention", "accuracy ~ softmax's",
               not_run="no SNLI model is implemented. Running it: SNLI (570k pairs) and an LSTM with attention, a few "
                       "CPU-hours per seed; the finetune experiment measures attention sparsity for a transformer "
                       "instead"),
)
"""The sparsemax paper's claim that no experiment runs."""

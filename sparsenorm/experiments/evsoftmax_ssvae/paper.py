"""The ev-softmax paper's Table 2 (semi-supervised VAE) and this experiment's defaults and run modes: a
leaf module (imports nothing of the experiment), shared by the experiment, its claims and its report; its
claims' rows of the catalogue (:data:`PAPER_CLAIMS`)."""
from typing import Dict, Tuple

from .._shared.paper_claims import EV, PaperClaim

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
                            else 1.0, "decoder_calls_se": 0.0}
                     for name, (acc, se) in PAPER_ACCURACY.items()})  # its Monte-Carlo rows
MARGINALISATION = ("softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax")
"""Table 2's marginalisation rows (the rest are Monte-Carlo estimators)."""
LABELS = {"softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax-1.5", "posthoc_evidential": "post-hoc",
          "ev_softmax": "ev-softmax"}

PAPER_ACC = {n: f"{row['accuracy']:.2f}" for n, row in PAPER_TABLE2.items()}
PAPER_CALLS = {n: f"{row['decoder_calls']:.2f}" for n, row in PAPER_TABLE2.items()}
"""Table 2's accuracies (%) and decoder calls as the notes and the catalogue print them."""
_CUTS = [100 * (1 - PAPER_TABLE2[n]["decoder_calls"] / PAPER_TABLE2["softmax"]["decoder_calls"])
         for n in ("sparsemax", "entmax15", "ev_softmax")]
PAPER_CALL_CUTS = f"{min(_CUTS):.0f}-{max(_CUTS):.0f} %"
"""How many fewer decoder calls than softmax the sparse normalizers make in Table 2 (a range, in %)."""

CLASSIFIER_WEIGHT = 200.0
"""Kingma et al.'s alpha on the labelled classification loss in the semi-supervised phase (the authors' code: 1).
Measured on softmax, seed 0, after a 20-epoch warm start at 94.2 % test accuracy, 10 epochs of 200 steps: alpha 1
falls to 88.0 %, 10 to 92.2 %, 50 stays near 94.5 % (93.6-94.6), 200 rises to 95.1-95.2 %; after the authors'
100-epoch warm start (95.5 %), alpha 100 rises to 95.7-96.3 % (96.0 % after the 10th epoch). Lowering the learning
rate instead (1e-4, alpha 1) still falls (94.8 -> 91.7 %)."""
FULL = dict(epochs=200, seeds=10, pretrain_epochs=100, steps_per_epoch=None, selection_examples=None,
            classifier_weight=CLASSIFIER_WEIGHT)
QUICK = dict(epochs=3, seeds=2, pretrain_epochs=10, steps_per_epoch=100, selection_examples=2000,
             classifier_weight=CLASSIFIER_WEIGHT)
DECISIVE = dict(epochs=10, seeds=6, pretrain_epochs=100, steps_per_epoch=200, selection_examples=2000,
                classifier_weight=CLASSIFIER_WEIGHT)
"""Decisive mode: the authors' 100 warm-start epochs (20 gave 94.2 % on softmax, seed 0; 100 give 95.5 %, at
about 75 CPU-s), then 10 semi-supervised epochs of 200 steps. Checked on seed 0 (`--decisive --seeds 1 --estimators
none`): warm start -> selected model, softmax 95.5 -> 96.05 %, sparsemax 95.3 -> 96.5 %, entmax-1.5 95.5 -> 96.2 %,
ev-softmax 95.2 -> 95.9 %: the regime gate is met (the committed run before this: softmax 94.3 -> 86.6 %). CPU per
semi-supervised step (one thread): softmax 29 ms, sparsemax 16 ms, entmax-1.5 17 ms, ev-softmax 20 ms."""

# ------------------------------------------------------------------------------------------ the regime gate
from .._shared.regime import Gate, Measured  # noqa: E402  (the shared gate record; nothing of the experiment)

GATE_SOFTMAX_ACCURACY = 95.0
"""Softmax's test accuracy (%, mean over seeds) the gate asks for (Table 2's is in :data:`PAPER_TABLE2`)."""


def _measure_gate(summary, records, settings) -> Measured:
    """Softmax's selected test accuracy, and every marginalisation method's against its own warm start (means over
    seeds; the Monte-Carlo estimators are left out: that some of them lose accuracy is one of Table 2's findings)."""
    per = summary["per_normalizer"]
    methods = [n for n in PAPER_TABLE2 if n in per and per[n]["seeds"] and n not in PAPER_ACCURACY]
    if "softmax" not in methods:
        return Measured(None, "softmax did not run")
    fell = [n for n in methods if per[n]["accuracy"] < per[n]["warm_start_accuracy"]]
    softmax = per["softmax"]["accuracy"]
    figure = (f"softmax {softmax:.1f} %; {len(fell)} of {len(methods)} marginalisation methods end below their warm "
              "start")
    detail = "warm start -> end: " + ", ".join(f"{n} {per[n]['warm_start_accuracy']:.1f} -> {per[n]['accuracy']:.1f}"
                                               for n in methods)
    return Measured(softmax >= GATE_SOFTMAX_ACCURACY and not fell, figure, detail)


_LOWEST, _HIGHEST = (f(PAPER_TABLE2[n]["accuracy"] for n in MARGINALISATION) for f in (min, max))

GATE = Gate(
    condition=(f"softmax's test accuracy (selected model, mean over seeds) is at least {GATE_SOFTMAX_ACCURACY:g} %, "
               "and no marginalisation method ends below its own test accuracy after the labelled-only warm start."),
    short=f"softmax >= {GATE_SOFTMAX_ACCURACY:g} %, no method below its warm start",
    reason=("Table 2 compares how well each normalizer marginalises M2's unlabelled term, in a regime where that term "
            f"helps: every marginalisation method ends at {_LOWEST:.1f}-{_HIGHEST:.1f} %, above what the 5,000 "
            "labelled images give alone. Where the unlabelled term lowers the classifier's accuracy below its warm "
            "start, the ranking measures how fast each method degrades a classifier, not how well it marginalises."),
    paper="Table 2: " + ", ".join(f"{LABELS[n]} {PAPER_ACC[n]} %" for n in MARGINALISATION),
    measure=_measure_gate,
)

# ------------------------------------------------------------------------------------------ the paper's claims
_MONTE_CARLO = "Sec. 4.2, Table 2 (Monte Carlo rows)"
FULL_PASS_STEPS = 704
"""Semi-supervised steps in one pass over the 45,000 unlabelled images at batch 64 (full mode's epoch)."""
DECISIVE_SHARE = DECISIVE["epochs"] * DECISIVE["steps_per_epoch"] / (FULL["epochs"] * FULL_PASS_STEPS)
"""Decisive mode's semi-supervised steps as a share of the paper's (10 x 200 of 200 x 704: 1.4 %)."""
SPARSE_REGIME_NOTE = (f"in decisive mode ({DECISIVE_SHARE:.1%} of the paper's semi-supervised training) ev-softmax "
                      "keeps about twice the paper's classes (3.5 vs 1.64): its sparse regime is not reached, so this "
                      "compares it before it gets there")
"""Said beside the claims that rest on ev-softmax's decoder calls (issue 49)."""
PAPER_CLAIMS = (
    PaperClaim("ev.ssvae.most_accurate", EV, SOURCE, "ev-softmax gives the highest accuracy of the "
               "marginalisation methods", f"{PAPER_ACC['ev_softmax']} vs {PAPER_ACC['entmax15']} (entmax-1.5), "
               f"{PAPER_ACC['softmax']} (softmax) %", "ssvae",
               quote=('Table 2 shows that using ev-softmax yields the highest classification accuracy of models using '
                      'either Monte Carlo methods or marginalization.'),
               primary=("ev-softmax vs every marginalisation method: softmax, sparsemax, entmax-1.5 (post-hoc's "
                        "accuracy is softmax's by construction)")),
    PaperClaim("ev.ssvae.beats_monte_carlo", EV, _MONTE_CARLO, "ev-softmax is more accurate than the Monte-Carlo "
               "gradient estimators SFE (moving-average baseline), NVIL, Gumbel and ST Gumbel (one decoder call per "
               "example each)", f"{PAPER_ACC['ev_softmax']} vs " + ", ".join(PAPER_ACC[e] for e in ONE_CALL_ESTIMATORS)
               + " % (Correia et al.'s numbers)", "ssvae",
               quote=('Table 2 shows that using ev-softmax yields the highest classification accuracy of models using '
                      'either Monte Carlo methods or marginalization.'),
               primary='ev-softmax vs each one-call Monte-Carlo estimator: SFE, NVIL, Gumbel, ST Gumbel'),
    PaperClaim("ev.ssvae.paper_scale", EV, SOURCE, f"Table 2's values at the paper's scale ({FULL['pretrain_epochs']} "
               f"warm-start and {FULL['epochs']} semi-supervised epochs of full passes, {FULL['seeds']} seeds)",
               f"ev-softmax {PAPER_ACC['ev_softmax']} %, {PAPER_CALLS['ev_softmax']} calls",
               not_run=f"the committed ssvae run is decisive mode ({DECISIVE_SHARE:.1%} of the paper's "
                       "semi-supervised training): its accuracies come within about a point of Table 2's (softmax "
                       "96.3 vs 96.93 %, ev-softmax 96.2 vs 97.30 %), but ev-softmax keeps about 3.5 classes per "
                       f"example where the paper's keeps {PAPER_CALLS['ev_softmax']}: its sparse regime is not "
                       "reached. Running it: `sparsenorm reproduce ssvae` (full mode), about 85 CPU-hours (1.8 days "
                       "on 2 idle cores), or a GPU"),
    PaperClaim("ev.ssvae.sum_and_sample", EV, _MONTE_CARLO, "ev-softmax is more accurate than SFE with a self-critic "
               "baseline (SFE+) and sum-and-sample (two decoder calls per example each)",
               f"{PAPER_ACC['ev_softmax']} vs " + ", ".join(PAPER_ACC[e] for e in TWO_CALL_ESTIMATORS)
               + " (Correia et al.'s numbers)", "ssvae",
               quote=('Table 2 shows that using ev-softmax yields the highest classification accuracy of models using '
                      'either Monte Carlo methods or marginalization.'),
               primary='ev-softmax vs each two-call Monte-Carlo estimator: SFE+, sum-and-sample'),
    PaperClaim("ev.ssvae.fewer_calls", EV, SOURCE, f"sparse normalizers cut the decoder calls by {PAPER_CALL_CUTS}",
               f"sparsemax {PAPER_CALLS['sparsemax']}, entmax-1.5 {PAPER_CALLS['entmax15']}, ev-softmax "
               f"{PAPER_CALLS['ev_softmax']} of {PAPER_TABLE2['softmax']['decoder_calls']:g}", "ssvae",
               caveat=SPARSE_REGIME_NOTE,
               quote=('Compared to sparsemax and entmax-1.5, ev-softmax maintains higher multimodality in the output '
                      'distribution, reducing the latent space by 84% on average. In particular, both sparsemax and '
                      'entmax-1.5 reduce the latent space by almost 90%, but at the cost of decreased accuracy.'),
               primary=("ev-softmax's cut (the first sentence; judged: at most 2 calls of 10); secondary: sparsemax's "
                        "and entmax-1.5's (the second)")),
    PaperClaim("ev.ssvae.more_modes", EV, SOURCE, "ev-softmax keeps more latent classes than sparsemax and entmax-1.5",
               f"{PAPER_CALLS['ev_softmax']} vs {PAPER_CALLS['sparsemax']}, {PAPER_CALLS['entmax15']}", "ssvae",
               caveat=SPARSE_REGIME_NOTE,
               quote=('Compared to sparsemax and entmax-1.5, ev-softmax maintains higher multimodality in the output '
                      'distribution, reducing the latent space by 84% on average.'),
               primary='ev-softmax vs sparsemax and vs entmax-1.5 in decoder calls (both named)'),
    PaperClaim("ev.ssvae.posthoc_worse", EV, SOURCE, "post-hoc evidential keeps more classes than ev-softmax, with a "
               "higher variance, and is less accurate",
               " vs ".join(f"{PAPER_CALLS[n]} ± {PAPER_TABLE2[n]['decoder_calls_se']:.2f}"
                           for n in ("posthoc_evidential", "ev_softmax"))
               + f"; {PAPER_ACC['posthoc_evidential']} vs {PAPER_ACC['ev_softmax']} %", "ssvae",
               caveat=SPARSE_REGIME_NOTE,
               quote=('On the other hand, post-hoc evidential sparsification preserves more latent classes than '
                      'ev-softmax but with a higher variance, and it also achieves a lower accuracy.'),
               primary=('post-hoc keeps more classes than ev-softmax (the main clause); secondary: the higher variance '
                        'and the lower accuracy')),
    PaperClaim("ev.ssvae.cheaper", EV, "Sec. 1, Sec. 6", "sparse marginalisation makes training cheaper than dense "
               "marginalisation", "qualitative", "ssvae",
               quote=('Normalization functions that yield sparse probability distributions can make exact '
                      'marginalization more computationally tractable.'),
               primary=('every sparse trained normalizer (ev-softmax, sparsemax, entmax-1.5) vs softmax, CPU time per '
                        'semi-supervised epoch')),
)
"""Sec. 4.2's claims, as the index lists them (:mod:`sparsenorm.experiments.catalogue`)."""

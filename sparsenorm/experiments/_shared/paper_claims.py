"""Every claim of the three papers, in one machine-readable catalogue.

Each :class:`PaperClaim` says where the paper makes the claim, the paper's value, and how sparsenorm
addresses it: an experiment that judges it (its :class:`~.verdict.Claim` carries the same ``key``,
so the index of :mod:`.paper_index` finds the verdict in the committed ``results.json`` files), the
test suite (a property of a function, not an experiment), or nothing yet, with the reason and what
running it would take. A claim that no experiment runs appears in the index as *not run*, so a
reader can tell "not reproduced" from "never tried".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

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


CLAIMS: Tuple[PaperClaim, ...] = (
    # ---------------------------------------------------------------- ev-softmax: theory (tests)
    PaperClaim("ev.fig1_example", EV, "Fig. 1, slides", "worked examples: ev-softmax((0.4, 1.4, -0.8)) ≈ (0.27, 0.73, 0) "
               "is bimodal where sparsemax gives (0, 1, 0)", "(0.27, 0.73, 0)",
               tests="tests/unit/test_evidential.py::test_fig1_values_to_three_decimals, "
                     "::test_worked_examples_match_literal_formula_and_printed_numbers; `sparsenorm demo`"),
    PaperClaim("ev.table1_properties", EV, "Table 1, App. C", "ev-softmax is monotonic, translation- and "
               "permutation-invariant, full-domain, and neither idempotent nor scale-invariant (as softmax)",
               "Table 1 check marks", tests="tests/unit/test_evidential.py::test_monotonic, ::test_translation_invariant, "
               "::test_permutation_invariant, ::test_full_domain, ::test_not_idempotent_and_not_scale_invariant; "
               "`sparsenorm demo` checks the whole table numerically"),
    PaperClaim("ev.gradient", EV, "Eq. 9, Eq. 12, App. D", "closed-form Jacobian of ev-softmax; the gradient of the "
               "log of the training form tends to delta - ev-softmax", "Eqs. 9, 12",
               tests="tests/unit/test_evidential.py::test_eq9_jacobian, ::test_eq12_gradient_of_log_train_tends_to_delta_"
                     "minus_ev_softmax, ::test_gradcheck_and_gradgradcheck"),
    PaperClaim("ev.posthoc_equivalence", EV, "Theorem 3.1, App. B", "post-hoc evidential sparsification of a linear "
               "layer's output equals ev-softmax", "Theorem 3.1",
               tests="tests/unit/test_evidential.py::test_theorem_3_1_posthoc_equals_ev_softmax, "
                     "::test_singleton_masses_match_dempsters_rule_by_brute_force"),
    # ---------------------------------------------------------------- ev-softmax Sec. 4.1: CVAE
    PaperClaim("ev.cvae.fastest_lowest", EV, "Sec. 4.1, Fig. 3", "ev-softmax converges the fastest and to the lowest "
               "Wasserstein distance to the true prior", "lowest curve of Fig. 3, 10 seeds", "cvae"),
    PaperClaim("ev.cvae.posthoc_second", EV, "Sec. 4.1, Fig. 3", "post-hoc evidential has the second lowest distance "
               "but converges more slowly than ev-softmax", "second curve of Fig. 3", "cvae"),
    PaperClaim("ev.cvae.softmax_slower", EV, "Sec. 4.1, Fig. 3", "softmax converges more slowly and to a higher "
               "distance than ev-softmax", "Fig. 3", "cvae"),
    PaperClaim("ev.cvae.sparsemax_collapse", EV, "Sec. 4.1, Fig. 2-3", "sparsemax collapses both the prior and the "
               "posterior to a single mode and does not converge toward the true prior", "1 mode (10 seeds, grid search)",
               "cvae"),
    PaperClaim("ev.cvae.entmax_fewer", EV, "Sec. 4.1, Fig. 2-3", "entmax-1.5 reduces the posterior latent space to fewer "
               "than ten classes and does not converge toward the true prior", "< 10 classes", "cvae"),
    PaperClaim("ev.cvae.five_modes", EV, "Sec. 4.1, Fig. 2", "ev-softmax learns a prior with five nonzero modes per "
               "query, on the digits of the query's parity", "5 modes, 'almost perfectly'", "cvae"),
    # ---------------------------------------------------------------- ev-softmax Sec. 4.2: semi-supervised VAE
    PaperClaim("ev.ssvae.most_accurate", EV, "Sec. 4.2, Table 2", "ev-softmax gives the highest accuracy of the "
               "marginalisation methods", "97.30 vs 97.20 (entmax-1.5), 96.93 (softmax) %", "ssvae"),
    PaperClaim("ev.ssvae.beats_monte_carlo", EV, "Sec. 4.2, Table 2 (Monte Carlo rows)", "ev-softmax is more accurate "
               "than the Monte-Carlo gradient estimators SFE (moving-average baseline), NVIL, Gumbel and ST Gumbel "
               "(one decoder call per example each)", "97.30 vs 94.75, 96.01, 95.46, 86.35 % (Correia et al.'s numbers)",
               "ssvae"),
    PaperClaim("ev.ssvae.paper_scale", EV, "Sec. 4.2, Table 2", "Table 2's values at the paper's scale (100 warm-start "
               "and 200 semi-supervised epochs of full passes, 10 seeds)", "ev-softmax 97.30 %, 1.64 calls",
               not_run="the committed ssvae run is decisive mode (1.4 % of the paper's semi-supervised training; its "
                       "accuracies are far from the paper's). Running it: `sparsenorm reproduce ssvae` (full mode), "
                       "about 85 CPU-hours (1.8 days on 2 idle cores), or a GPU"),
    PaperClaim("ev.ssvae.sum_and_sample", EV, "Sec. 4.2, Table 2 (Monte Carlo rows)", "ev-softmax is more accurate "
               "than SFE with a self-critic baseline (SFE+) and sum-and-sample (two decoder calls per example each)",
               "97.30 vs 96.53, 96.73 (Correia et al.'s numbers)", "ssvae"),
    PaperClaim("ev.ssvae.fewer_calls", EV, "Sec. 4.2, Table 2", "sparse normalizers cut the decoder calls by 84-90 %",
               "sparsemax 1.01, entmax-1.5 1.01, ev-softmax 1.64 of 10", "ssvae"),
    PaperClaim("ev.ssvae.more_modes", EV, "Sec. 4.2, Table 2", "ev-softmax keeps more latent classes than sparsemax "
               "and entmax-1.5", "1.64 vs 1.01, 1.01", "ssvae"),
    PaperClaim("ev.ssvae.posthoc_worse", EV, "Sec. 4.2, Table 2", "post-hoc evidential keeps more classes than "
               "ev-softmax, with a higher variance, and is less accurate", "1.72 ± 0.05 vs 1.64 ± 0.01; 96.90 vs 97.30 %",
               "ssvae"),
    PaperClaim("ev.ssvae.cheaper", EV, "Sec. 1, Sec. 6", "sparse marginalisation makes training cheaper than dense "
               "marginalisation", "qualitative", "ssvae"),
    # ---------------------------------------------------------------- ev-softmax Sec. 4.3: VQ-VAE
    PaperClaim("ev.vqvae.most_accurate", EV, "Sec. 4.3, Table 3", "ev-softmax's samples are the most accurate "
               "(classifier top-k)", "top-5/10 43.6/55.6 vs sparsemax 40.0/52.0", "vqvae"),
    PaperClaim("ev.vqvae.k_order", EV, "Sec. 4.3, Table 3", "nonzero codes K: sparsemax < ev-softmax < entmax-1.5 < "
               "post-hoc < softmax (85 % fewer than softmax for ev-softmax)", "K 46, 77, 90, 102, 512", "vqvae"),
    PaperClaim("ev.vqvae.sparse_beats_softmax", EV, "Sec. 4.3, Table 3", "the sparse priors trained sparse beat "
               "softmax; post-hoc does not", "top-5 40.0, 38.4, 43.6 vs 38.4; post-hoc 38.2", "vqvae"),
    PaperClaim("ev.vqvae.tinyimagenet", EV, "Sec. 4.3, Table 3", "Table 3's values on tinyImageNet (200 classes, "
               "WRN classifier, 10 x 128 PixelCNN)", "43.6 / 55.6 / 77",
               not_run="tinyImageNet is not shipped by any registry here; the vqvae experiment runs Fashion-MNIST "
                       "(its values are not comparable). Running it: `--data-dir` an ImageFolder copy of "
                       "tinyImageNet; the paper's widths cost about 7x the full mode per step: a GPU job"),
    # ---------------------------------------------------------------- ev-softmax Sec. 4.4: translation
    PaperClaim("ev.mt.highest_bleu", EV, "Sec. 4.4, Table 4", "ev-softmax attention gives the highest BLEU",
               "29.4 vs 29.2, 29.0, 29.2, 29.2 (5 seeds)", "mt"),
    PaperClaim("ev.mt.attended_order", EV, "Sec. 4.4, Table 4", "attended keys: ev-softmax keeps the most of the "
               "sparse normalizers, fewer than softmax", "# attended 2.3, 4.1, 3.8, 8.2, 39.5", "mt"),
    PaperClaim("ev.mt.rouge", EV, "Sec. 4.4, Table 4", "ev-softmax has the highest ROUGE-1/2/L, significantly (0.05 / "
               "0.01) above sparsemax, entmax-1.5 and post-hoc", "ROUGE-L 56.18 vs 56.09, 55.39**, 55.75*, 55.93*", "mt"),
    PaperClaim("ev.mt.meteor", EV, "Sec. 4.4, Table 4", "ev-softmax has the highest METEOR, significantly above every "
               "other normalizer", "57.20 vs 57.02*, 56.33**, 5.83** (sic), 56.84**", "mt"),
    PaperClaim("ev.mt.fig4_maps", EV, "Sec. 4.4, Fig. 4", "on a short sentence sparsemax and entmax-1.5 attend over two "
               "source words while ev-softmax and softmax attend over the whole source (the paper: \"Sparsemax and "
               "entmax-1.5 both attend over two words while ev-softmax and softmax attend over the entire source\")",
               "one example sentence", "mt"),
    PaperClaim("ev.mt.iwslt", EV, "Sec. 4.4, Table 4", "Table 4's values on IWSLT 2014 EN-DE with a transformer-base",
               "BLEU 29.4",
               not_run="IWSLT 2014 is not reachable here; the mt experiment runs a small model on LibreOffice help "
                       "EN-DE pairs (values not comparable). Running it: `--data-dir` the IWSLT files and a GPU "
                       "(transformer-base, 40k steps)"),
    # ---------------------------------------------------------------- r-softmax: theory (tests)
    PaperClaim("r.rate_exact", RS, "Sec. 3, Eq. 2-3", "r-softmax gives a fraction r of zeros (the sparsity rate) and "
               "is a probability distribution; t-softmax with a learnable t", "definition",
               tests="tests/unit/test_rsoftmax.py::test_properties and the rest of tests/unit/test_rsoftmax.py"),
    PaperClaim("r.zero_is_softmax", RS, "Sec. 1", "for a sparsity rate r = 0, r-softmax is the classical softmax",
               "stated in the introduction", tests="tests/unit/test_rsoftmax.py::test_r_softmax_at_zero_still_zeroes_the_"
               "minimum: under the paper's own Eq. 3 the threshold at r = 0 comes from the quantile 0, the minimum, "
               "whose weight is then zero, so r = 0 still zeroes the smallest entry and the statement is false as "
               "written; softmax is only the limit t -> infinity of t-softmax (Theorem 1, "
               "::test_t_softmax_theorem_1)"),
    PaperClaim("r.loss", RS, "Sec. 3, Eq. 4", "the multi-label loss of Eq. 4 trains r-softmax", "Eq. 4",
               tests="tests/unit/test_rsoftmax_losses.py"),
    # ---------------------------------------------------------------- r-softmax Sec. 4.1: multi-label
    PaperClaim("r.multilabel.beats_sparse", RS, "Sec. 4.1, Table 1, Fig. 2", "r-softmax beats sparsemax (huber and "
               "hinge) and sparsehourglass", "VOC 77.90 vs 66.84, 71.91, 71.35; COCO 72.56 vs 52.30, 65.67, 64.85",
               "multilabel"),
    PaperClaim("r.multilabel.on_par_softmax", RS, "Sec. 4.1, Table 1", "r-softmax is on par with softmax at its best "
               "threshold", "VOC 77.90 vs 79.43; COCO 72.56 vs 72.29", "multilabel"),
    PaperClaim("r.multilabel.best_many_labels", RS, "Sec. 4.1, Fig. 2a", "r-softmax is the best method when the "
               "average number of labels grows, especially with many classes (20, 30)", "Fig. 2a curves",
               "multilabel"),
    PaperClaim("r.multilabel.document_length", RS, "Sec. 4.1, Fig. 2b", "r-softmax is superior or comparable across "
               "document lengths", "Fig. 2b curves", "multilabel"),
    PaperClaim("r.multilabel.fixed_threshold_fails", RS, "Sec. 4.1, Fig. 2", "softmax with a fixed threshold "
               "p0 in {0.1, 0.2} fails at 20 and 30 classes", "omitted from the plots as 'significantly worse'",
               "multilabel"),
    PaperClaim("r.multilabel.similar_few_classes", RS, "Sec. 4.1, Fig. 2 caption, Fig. 2a-2b text", "with few output "
               "classes (10) all functions produce similar results", "Fig. 2 left plots", "multilabel"),
    PaperClaim("r.multilabel.softmax_converges_faster", RS, "Sec. 4.1, Fig. 3", "some softmax versions with a particular "
               "threshold converge faster than r-softmax (judged on yeast's test learning curves: their first tenth of "
               "the epochs, the validation-chosen threshold against r-softmax, paired by seed)", "Fig. 3 curves",
               "multilabel"),
    PaperClaim("r.multilabel.learning_curves", RS, "Sec. 4.1, Fig. 3", "r-softmax learns much better than the other "
               "sparse alternatives over training (judged on yeast's test learning curves: their mean over epochs, "
               "paired by seed; the paper's are VOC and COCO)", "Fig. 3 curves", "multilabel"),
    PaperClaim("r.multilabel.voc_coco", RS, "Sec. 4.1, Table 1", "Table 1's values on VOC and COCO with pretrained "
               "ResNet features", "VOC 77.90, COCO 72.56",
               not_run="VOC/COCO images and the ResNet features are not available here; yeast is the real data set. "
                       "Running it: `--data-dir` with precomputed features (X, Y) of VOC/COCO; the training is as "
                       "cheap as yeast's per example"),
    # ---------------------------------------------------------------- r-softmax Sec. 4.2: fine-tuning
    PaperClaim("r.finetune.matches_softmax", RS, "Sec. 4.2, Table 2", "r-softmax attention matches or beats softmax "
               "after fine-tuning", "SST-2 92.89 vs 92.32 (best run of the grid)", "finetune"),
    PaperClaim("r.finetune.sparsemax_breaks", RS, "Sec. 4.2, Table 2", "sparsemax attention performs poorly "
               "(breaks the pretrained model)", "SST-2 79.82 vs 92.32", "finetune"),
    PaperClaim("r.finetune.sparsehourglass_breaks", RS, "Sec. 4.2, Table 2", "sparsehourglass attention performs "
               "poorly", "SST-2 79.24 vs 92.32", "finetune"),
    PaperClaim("r.finetune.small_r", RS, "Sec. 4.2, Results", "a small final r (0.1-0.2) works best; a large r (0.5) "
               "is worse (the final-r sweep)", "best r 0.1-0.2 per task", "finetune"),
    PaperClaim("r.finetune.glue", RS, "Sec. 4.2, Table 2", "the same on MRPC, RTE, QNLI and QQP with BERT",
               "e.g. RTE 71.84 vs 68.95",
               not_run="GLUE and BERT-base are not reachable here; the finetune experiment runs MiniLM on Rotten "
                       "Tomatoes (SST-2's source sentences). Running it: `--model-dir` a BERT checkpoint and "
                       "`--data-dir` the GLUE TSVs; about a day per task on 2 cores, an hour or two on a GPU"),
    # ---------------------------------------------------------------- sparsemax paper
    PaperClaim("sm.properties", SM, "Sec. 2, Prop. 1-2", "sparsemax is the Euclidean projection onto the simplex, "
               "translation-invariant, permutation-equivariant, monotonic, idempotent; closed-form threshold",
               "Prop. 1-2", tests="tests/unit/test_sparsemax.py::test_property_* (hypothesis), checked against the entmax "
                                  "package"),
    PaperClaim("sm.jacobian", SM, "Sec. 2.5", "the Jacobian is diag(s) - s s^T / |S|", "closed form",
               tests="tests/unit/test_sparsemax.py::test_gradients_match_entmax_package, ::test_gradcheck_exact"),
    PaperClaim("sm.loss", SM, "Sec. 3", "the sparsemax loss is convex, differentiable, zero iff sparsemax(z) = "
               "delta_k; its binary case is the modified Huber loss", "Prop. 3-4",
               tests="tests/unit/test_fenchel_young.py::test_sparsemax_loss_binary_is_modified_huber and the rest of that "
                     "file"),
    PaperClaim("sm.two_class_hard_sigmoid", SM, "Sec. 2.2", "in two dimensions sparsemax is a \"hard\" sigmoid: "
               "sparsemax([t, 0])_1 = clip((t + 1) / 2, 0, 1)", "closed form",
               tests="tests/unit/test_sparsemax.py::test_two_class_closed_form"),
    PaperClaim("sm.cost", SM, "Sec. 2.1-2.3", "sparsemax is evaluated exactly by a sort (O(K log K)) or by selection "
               "(O(K)), and its Jacobian-vector product costs O(|S|)", "complexity bounds",
               measured="benchmarks/results/cpu_normalizers.json (`make bench`; tables in benchmarks/README.md): "
                        "sparsemax forward+backward at 0.94-1.94x softmax's time at 4096 x 128 and within its targets "
                        "on long rows (256 x 32000, 16384 x 512)"),
    PaperClaim("sm.multilabel.competitive", SM, "Sec. 4 (simulation)", "with its own loss, sparsemax is competitive "
               "with softmax + threshold and per-label logistic regression on scikit-learn's simulated data",
               "similar F1 across label counts and document lengths", "multilabel"),
    PaperClaim("sm.multilabel.benchmarks", SM, "Sec. 4, Table 2", "the same on the real benchmarks scene, emotions, "
               "birds, CAL500, reuters (micro/macro F1)", "per-data-set F1 table",
               not_run="those five data sets are not on this machine's registries (the multilabel experiment's real "
                       "data set is yeast, which the paper does not use). Running it: each is small (< 10k "
                       "examples); with `--data-dir` copies, about yeast's cost each (minutes per seed)"),
    PaperClaim("sm.snli_attention", SM, "Sec. 4.3", "sparsemax attention in an LSTM NLI model on SNLI: similar accuracy "
               "to softmax, far more compact attention", "accuracy ~ softmax's",
               not_run="no SNLI model is implemented. Running it: SNLI (570k pairs) and an LSTM with attention, a few "
                       "CPU-hours per seed; the finetune experiment measures attention sparsity for a transformer "
                       "instead"),
)

OURS = "sparsenorm's own experiments"
"""The "paper" of :data:`OWN_CLAIMS`: hypotheses of sparsenorm's own experiments, which no paper states."""

OWN_CLAIMS: Tuple[PaperClaim, ...] = (
    # ---------------------------------------------------------------- issue 37: a pretrained LM, no training
    PaperClaim("own.llm.posthoc_on_par", OURS, "issue 37", "post-hoc ev-softmax in every attention layer of SmolLM2-135M, "
               "without training, keeps the NLL per token within 0.1 nats of softmax's",
               "no paper; issue 37: 2.66 -> 2.97 nats on one paragraph", "llm"),
    PaperClaim("own.llm.posthoc_least_cost", OURS, "issue 37", "of the sparse attentions swapped in without training, "
               "post-hoc ev-softmax costs the least perplexity (vs 1.5-entmax, sparsemax, alpha-entmax 1.25 and 1.75)",
               "no paper; issue 37: ev 2.97, 1.5-entmax 3.21, sparsemax 4.33 nats on one paragraph", "llm"),
    PaperClaim("own.llm.alpha_order", OURS, "issue 37", "the larger alpha-entmax's alpha, the higher the NLL and the "
               "fewer attention weights kept", "no paper", "llm"),
    PaperClaim("own.llm.greedy_agreement", OURS, "issue 37", "greedy continuations with post-hoc ev-softmax attention "
               "follow softmax's for longer than with 1.5-entmax and sparsemax", "no paper", "llm"),
    PaperClaim("own.llm.coverage_entmax15", OURS, "issue 37", "1.5-entmax on the LM head keeps the true next token in "
               "its support more often than top-p, top-k and min-p at the same mean support", "no paper", "llm"),
    PaperClaim("own.llm.coverage_sparsemax", OURS, "issue 37", "sparsemax on the LM head keeps the true next token in "
               "its support more often than top-p, top-k and min-p at the same mean support", "no paper", "llm"),
)
"""Claims of sparsenorm's own experiments: judged by the same rule, listed in the index under their own heading."""

BY_KEY: Dict[str, PaperClaim] = {c.key: c for c in CLAIMS + OWN_CLAIMS}
if len(BY_KEY) != len(CLAIMS) + len(OWN_CLAIMS):
    raise RuntimeError("duplicate claim keys in the catalogue")

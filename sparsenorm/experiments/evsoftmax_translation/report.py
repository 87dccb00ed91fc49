"""report.md's body with its figures, from the summary over seeds (:func:`.claims.aggregate`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ... import registry
from ..._text import markdown_table
from .._shared.figures import headless_pyplot, save_figure
from .._shared.runner import Report
from .model import SITES
from .paper import PAPER_SEEDS, PAPER_TABLE, POSTHOC, display_name


# ------------------------------------------------------------------------------------ report


def _fmt(stats: Dict[str, Any], digits: int = 2) -> str:
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def _table4(summary, names: List[str]) -> str:

    rows = summary["normalizers"]

    def paper(key):
        return [PAPER_TABLE.get(n, {}).get(key, "–") for n in names]

    body = [
        ["BLEU (beam)"] + [_fmt(rows[n]["bleu"]) for n in names],
        ["BLEU, paper"] + paper("bleu"),
        ["BLEU (greedy)"] + [_fmt(rows[n]["bleu_greedy"]) for n in names],
        ["chrF (beam)"] + [_fmt(rows[n]["chrf"]) for n in names],
        *(row for k in ("rouge_1", "rouge_2") if all(k in rows[n] for n in names)
          for row in ([f"ROUGE-{k[-1]} (beam)"] + [_fmt(rows[n][k]) for n in names],
                      [f"ROUGE-{k[-1]}, paper"] + paper(k))),
        ["ROUGE-L (beam)"] + [_fmt(rows[n]["rouge_l"]) for n in names],
        ["ROUGE-L, paper"] + paper("rouge_l"),
        ["METEOR (beam)"] + [_fmt(rows[n]["meteor"]) if "meteor" in rows[n] else "not computed" for n in names],
        ["METEOR, paper"] + paper("meteor"),
    ]
    for site in ("cross", "encoder", "decoder"):
        body.append([f"# attended, {site}"] + [
            f"{rows[n]['attended'][site]['mean']['mean']:.2f} ± {rows[n]['attended'][site]['std_over_queries']:.2f} "
            f"(of {rows[n]['attended'][site]['valid']:.1f})" for n in names])
    body.append(["# attended, paper"] + paper("attended"))
    return markdown_table(["metric"] + [display_name(n) for n in names], body)


def _layers_table(summary, names: List[str]) -> str:
    rows = summary["normalizers"]
    body = []
    for site in SITES:
        for i in range(len(rows[names[0]]["attended"][site]["layers"])):
            body.append([f"{site} layer {i + 1}"] + [f"{rows[n]['attended'][site]['layers'][i]:.2f}" for n in names])
    return markdown_table(["site, layer"] + [display_name(n) for n in names], body)


def _significance(summary) -> str:
    sig = summary.get("significance")
    if not sig:
        return "Paired bootstrap: not run (needs ev-softmax and another normalizer)."
    body = [[display_name(n), f"{v['BLEU']['score']:.2f}",
             "–" if v["BLEU"]["p_value"] is None else f"{v['BLEU']['p_value']:.4f}",
             f"{v['chrF']['score']:.2f}", "–" if v["chrF"]["p_value"] is None else f"{v['chrF']['p_value']:.4f}"]
            for n, v in sig["systems"].items()]
    return (f"Paired bootstrap resampling (sacrebleu, {sig['samples']} resamples) of each system against ev-softmax, "
            f"beam outputs of seed {sig['seed']}; p is the probability of a difference this large by chance.\n\n"
            + markdown_table(["system", "BLEU", "p (BLEU)", "chrF", "p (chrF)"], body))


def _figure_bleu_vs_attended(out: Path, summary, names: List[str]) -> Path:
    plt = headless_pyplot()
    rows = summary["normalizers"]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for n in names:
        a, b = rows[n]["attended"]["cross"]["mean"], rows[n]["bleu"]
        ax.errorbar(a["mean"], b["mean"], xerr=a["std"], yerr=b["std"], fmt="o", capsize=3, label=display_name(n))
        ax.annotate(display_name(n), (a["mean"], b["mean"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("# attended source keys per query (cross-attention, mean)")
    ax.set_ylabel("test BLEU (beam)")
    ax.set_title("BLEU vs attended keys (error bars: std over seeds)")
    ax.grid(alpha=0.3)
    return save_figure(fig, out / "bleu_vs_attended.png")


def _figure_maps(out: Path, records, names: List[str], context) -> Optional[Path]:
    import sentencepiece as spm

    shown = [n for n in ("softmax", "ev_softmax", "sparsemax", "entmax15", POSTHOC, "r_softmax") if n in names]
    first = {}
    for rec in records:
        for n, ev in rec["evaluations"].items():
            if n in shown and n not in first:
                first[n] = ev["cross_maps"]
    if not first or context is None:
        return None
    sp = spm.SentencePieceProcessor(model_proto=context["spm_proto"])
    examples = [context["test"][i] for i in context["map_indices"]]
    plt = headless_pyplot()
    n_rows = min(len(examples), 2)
    fig, axes = plt.subplots(n_rows, len(shown), figsize=(3.2 * len(shown), 3.2 * n_rows), squeeze=False)
    for r in range(n_rows):
        src = [sp.id_to_piece(t) for t in examples[r][0]]
        tgt = [sp.id_to_piece(t) for t in examples[r][1][:-1]]
        for c, n in enumerate(shown):
            ax = axes[r][c]
            w = np.asarray(first[n][r])
            ax.imshow(np.where(w > 0, w, np.nan), cmap="viridis", vmin=0, vmax=1, aspect="auto")
            ax.set_xticks(range(len(src)), src, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tgt)), tgt, fontsize=6)
            ax.set_title(f"{display_name(n)} (zeros blank)", fontsize=8)
    fig.suptitle("Cross-attention, last decoder layer, mean over heads (first seed; teacher-forced)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out / "cross_attention_maps.png")


def _figure_loss(out: Path, records) -> Path:
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for rec in records:
        h = np.asarray(rec["history"], dtype=float)
        if len(h):
            ax.plot(h[:, 0], h[:, 1], label=f"{display_name(rec['train'])} s{rec['seed']}", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss per token")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_figure(fig, out / "training_loss.png")


EXAMPLES = 6
"""Test pairs shown in the report: the first ones of the test split (not chosen), enough to judge whether the
outputs translate."""


def _examples(records: List[Dict[str, Any]], context) -> str:
    """The first :data:`EXAMPLES` test sources, their references and every normalizer's beam output (first seed)."""
    examples = ""
    if context:
        ex_rows = []
        for i in range(min(EXAMPLES, len(context["sources"]))):
            ex_rows.append(["source", context["sources"][i]])
            ex_rows.append(["reference", context["references"][i]])
            for rec in records:
                for n, ev in rec["evaluations"].items():
                    if rec["seed"] == records[0]["seed"]:
                        ex_rows.append([display_name(n), ev["beam"]["hypotheses"][i]])
        examples = markdown_table(["", "text"], ex_rows)
    return examples


def _setting_section(summary: Dict[str, Any], settings, data: Dict[str, Any], first: Dict[str, Any], params: str
                     ) -> str:
    s = settings
    sites = f"overridden: {s.site_overrides}" if s.site_overrides else "all three sites"
    bleu, chrf = first["bleu_signature"], first["chrf_signature"]
    return f"""
## Setting

- **Data**: {data.get('source', 'see settings')}. Pairs: {data.get('pairs')}; used: {data.get('train_used')} training
  pairs ({data.get('train_tokens')} subword tokens), {data.get('test_used')} test pairs (at most
  {s.max_src_tokens} source subwords). Shared SentencePiece unigram vocabulary of {data.get('vocab')} pieces,
  trained on the training split only.
- **Model**: pre-LN encoder-decoder transformer, {s.enc_layers}+{s.dec_layers} layers, d {s.d_model},
  {s.heads} heads, FFN {s.ffn}, tied embeddings, dropout {s.dropout}; the normalizer in encoder self-,
  decoder self- and cross-attention ({sites});
  output layer: {s.output_normalizer} (registry loss, label smoothing {s.label_smoothing} where the loss takes a
  target distribution). Adam (0.9, 0.98), noam schedule (peak {s.lr}, warm-up {s.warmup}),
  {s.steps} steps of about {s.max_tokens} tokens; world size {summary.get('world_size')} (DDP).
  Parameters fixed: {params or 'none'} (registry defaults).
- **Decoding**: beam {s.beam} with length penalty alpha {s.length_penalty} (and greedy), batched.
- **Metrics**: sacrebleu on detokenised output: `{bleu}`, `{chrf}`. ROUGE-L: rouge-score
  (F1 over 13a tokens). METEOR: {summary.get('meteor_method') or 'not computed'}, per sentence over 13a tokens,
  lowercased, averaged over the test set (`evsoftmax_translation/meteor.py`; computed from the stored beam outputs when
  the results are aggregated). # attended: nonzero weights per query over valid keys of valid queries
  (`sparsenorm.attention.record`), teacher-forced on the test references, mean ± std over queries (seed mean); "of N" is
  the mean number of valid keys per query.

"""


def _results_section(summary: Dict[str, Any], settings, names: List[str]) -> str:
    longest = settings.max_src_tokens
    return f"""## Table 4, side by side

{_table4(summary, names)}

The paper does not say which attention its "# attended" counts; its Fig. 4 counts source words, so it is compared with
our cross-attention row. Our sentences are shorter (software help paragraphs, at most {longest} subwords),
so absolute counts are smaller; the ordering is what can be compared.

### # attended per layer (mean over queries and seeds)

{_layers_table(summary, names)}

### Significance

{_significance(summary)}

"""


def _differences_section(rows: Dict[str, Any], settings, examples: str, maps) -> str:
    steps = ("a small model for a few hundred steps (quick mode)" if settings.steps < 2000
             else f"{settings.steps} steps")
    return f"""## Masks: where this run differs from the authors' code

The authors' OpenNMT fork filled masked scores with -1e18 *before* ev-softmax's mean, so the mean of every padded or
causally masked row was dragged far below every real score and ev-softmax silently became softmax there: in decoder
self-attention, every row but the last; in the other sites, every sentence shorter than the longest in its batch.
Here masked keys are "not there" (`sparsenorm.attention.sparse_attention`): excluded from ev-softmax's mean and given
exactly zero weight, for every normalizer. Check: a test sentence's decoder features alone vs padded in a batch with a
longer one differ by at most {max(r['padding_max_abs_diff'] for r in rows.values()):.1e}. To our knowledge this is the
first run of ev-softmax attention with correct masks.

## Differences from the paper

- Data: LibreOffice help (software documentation, short paragraphs) instead of IWSLT'14 TED talks; `--data-dir` takes
  IWSLT'14 or any `train/valid/test.{{en,de}}` files.
- No WMT'16 pre-training: each model is trained from scratch; {steps}
  instead of a fine-tuned transformer-base (40k/50k steps). The validation split is not used (no checkpoint selection).
- Output layer softmax by default (the authors' code also put ev-softmax/sparsemax there; `--output-normalizer same`).
- The # attended is counted with teacher forcing on the references, not during free decoding.
- Seeds: {settings.seeds} (paper: {PAPER_SEEDS}); spread is the standard deviation over seeds (paper: standard error).

## Examples (beam, first seed, the first {EXAMPLES} test pairs)

{examples}

![BLEU vs attended](bleu_vs_attended.png)

{'![cross-attention maps](cross_attention_maps.png)' if maps is not None else ''}

![training loss](training_loss.png)
"""


def write_report(out: Path, summary: Dict[str, Any], records: List[Dict[str, Any]], settings, context) -> Report:
    rows = summary["normalizers"]
    order = ["softmax", "sparsemax", "entmax15", POSTHOC, "ev_softmax", "r_softmax"]
    names = [n for n in order if n in rows] + [n for n in rows if n not in order]
    figures = {"bleu_vs_attended": _figure_bleu_vs_attended(out, summary, names),
               "training_loss": _figure_loss(out, records)}
    maps = _figure_maps(out, records, names, context)
    if maps is not None:
        figures["cross_attention_maps"] = maps
    data = context["data"] if context else {}
    params = ", ".join(f"{n}: {registry.get(n).params}" for n in names if registry.get(n).params)
    body = (_setting_section(summary, settings, data, rows[names[0]], params)
            + _results_section(summary, settings, names)
            + _differences_section(rows, settings, _examples(records, context), maps))
    return Report(body=body, figures=figures, headline="bleu_vs_attended")

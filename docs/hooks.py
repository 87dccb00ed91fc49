"""MkDocs hook: the committed results/ and benchmarks/ folders become pages of the site.

Their Markdown is generated (``sparsenorm reproduce --index results/``, the experiments' reports)
or kept beside the code it describes (benchmarks/README.md), so the site takes the files where
they are instead of a copy that could drift. A folder's README.md becomes its index page, and the
figures next to a report are copied with it, so the reports' relative links resolve. The
benchmarks' committed JSON results become a generated page, benchmarks/results.md (tables and a
memory plot). A link
from those files into docs/ (right when read on GitHub) is rewritten to where that page is on the site.
"""
from __future__ import annotations

import importlib
import io
import json
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO_ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("results", "benchmarks")
SUFFIXES = {".md", ".png", ".svg"}


def on_config(config):
    # This checkout's sparsenorm and benchmarks, however mkdocs was started (MkDocs restores
    # sys.path after loading a hook, so this is done here rather than at import).
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return config


def on_files(files, config):
    for folder in FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES:
                files.append(File(path.relative_to(REPO_ROOT).as_posix(), str(REPO_ROOT), config["site_dir"],
                                  config["use_directory_urls"]))
    page, figures = benchmark_results_page()
    files.append(File.generated(config, "benchmarks/results.md", content=page))
    for name, png in figures.items():
        files.append(File.generated(config, f"benchmarks/{name}", content=png))
    return files


def benchmark_results_page():
    """benchmarks/results/*.json as Markdown tables: the normalizer benchmark's files (benchmarks.bench,
    told by their "schema") with their targets and pass/miss, the attention reports with a plot of
    peak memory against L per candidate where matplotlib is installed. Returns (markdown, {file name: PNG bytes})."""
    from benchmarks import (bench, bench_attention, bench_generate, bench_linear_ce_torch, bench_linear_loss,
                            bench_tuning)

    lines = ["# Benchmark results (generated)", "",
             "Rendered at build time from the JSON files committed under `benchmarks/results/` "
             "(`python -m benchmarks.bench --report FILE` or `python -m benchmarks.bench_attention --report FILE` "
             "prints the same tables). The method "
             "is in [Benchmarks](README.md); the commit that added each file says where it was measured."]
    figures = {}
    for path in sorted((REPO_ROOT / "benchmarks" / "results").glob("*.json")):
        results = json.loads(path.read_text())
        if results.get("schema") == bench.SCHEMA:
            lines += ["", f"## `{path.name}`", "", bench.markdown_report(results)]
            continue
        if results.get("schema") == bench_linear_loss.SCHEMA:
            lines += ["", f"## `{path.name}`", "", bench_linear_loss.markdown_report(results)]
            continue
        if results.get("schema") == bench_linear_ce_torch.SCHEMA:
            lines += ["", f"## `{path.name}`", "", bench_linear_ce_torch.markdown_report(results)]
            continue
        if results.get("schema") == bench_tuning.SCHEMA:
            lines += ["", f"## `{path.name}`", "", bench_tuning.markdown_report(results)]
            continue
        if results.get("schema") == bench_generate.SCHEMA:
            lines += ["", f"## `{path.name}`", "", bench_generate.report(results)]
            continue
        lines += ["", f"## `{path.name}`", "", bench_attention.markdown_report(results)]
        png = memory_plot(results)
        if png is not None:
            figures[path.stem + "_memory.png"] = png
            lines += ["", f"![Peak extra memory against L, {path.stem}]({path.stem}_memory.png)"]
    return "\n".join(lines) + "\n", figures


def memory_plot(results):
    """Peak extra memory (MB) against L, log-log, one line per candidate; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = {}
    for table in ("peak_bytes", "scaling_bytes"):
        for length, peaks in results.get(table, {}).items():
            for label, peak in peaks.items():
                if peak is not None:
                    series.setdefault(label, {})[int(length)] = peak / 2**20
    if not series:  # a time-only run (--no-memory)
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, points in series.items():
        lengths = sorted(points)
        ax.plot(lengths, [points[n] for n in lengths], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="peak extra memory (MB)",
           title=f"forward+backward, float32, CPU, B*H = {results['batch_heads']}, D = {results['dim']}")
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("results/"):
        page.meta["hide"] = ["navigation", "toc"]  # the claims table needs the width (Material reads this key)
    if page.file.src_uri.startswith(tuple(f + "/" for f in FOLDERS)):
        depth = page.file.src_uri.count("/")
        markdown = markdown.replace("](" + "../" * depth + "docs/", "](" + "../" * depth)
    return markdown


# Docstrings cite other objects with Sphinx roles (:func:`ev_softmax`), which mkdocstrings' Google
# parser leaves as text. On the API pages the role is dropped and the name linked to its entry: the
# name is looked up from the object whose entry it appears in outwards (its class, its module, the
# package), and left as plain code where nothing matches.
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):<code>~?\.?([\w.]+)</code>")
ANCHOR = re.compile(r'id="(sparsenorm(?:\.\w+)*)"')


def resolve(path: str):
    """The object a dotted path names (the longest importable module prefix, then attributes);
    ImportError or AttributeError where it names nothing. tests/unit/test_docs.py uses it too."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _importable(path: str) -> bool:
    try:
        resolve(path)
    except (ImportError, AttributeError):
        return False
    return True


def on_page_content(html, page, config, files):
    if not page.file.src_uri.startswith("api/"):
        return html

    def link(match):
        target = match.group(1)
        anchors = ANCHOR.findall(html, 0, match.start())
        scope = anchors[-1].split(".") if anchors else ["sparsenorm"]
        candidates = [target] if target.startswith("sparsenorm") else [
            ".".join(scope[:cut] + [target]) for cut in range(len(scope), 0, -1)]
        for identifier in candidates:
            if _importable(identifier):
                return f'<autoref identifier="{identifier}" optional><code>{target}</code></autoref>'
        return f"<code>{target}</code>"

    return ROLE.sub(link, html)

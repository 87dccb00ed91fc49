"""The documentation site: the strict MkDocs build passes and every public name has an API entry.

The build (``mkdocs build --strict``, as ``make docs`` runs it) fails on any warning: an unresolved
link or anchor, a page missing from the navigation, an object mkdocstrings cannot find. On top of
it, every name in ``sparsenorm.__all__`` and in the ``__all__`` of every public module must be the
object of some entry of the API reference (an HTML anchor ``id="sparsenorm...."``, which may be
the name's canonical path, e.g. ``sparsenorm.evidential.ev_softmax`` for ``sparsenorm.ev_softmax``).
The errors table of the user guide is checked against the source, the README's links against the
tree, and the README's claim counts per experiment against the generated index (results/README.md).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import sparsenorm
from sparsenorm.experiments._shared import regime

REPO = Path(__file__).resolve().parents[2]
DOCS_TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _docs_tools_missing() -> list[str]:
    missing = []
    for module in DOCS_TOOLS:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


needs_docs_tools = pytest.mark.skipif(
    bool(_docs_tools_missing()),
    reason=f"the docs extra is not installed (missing {', '.join(_docs_tools_missing())}): "
           "pip install -e '.[docs]' to build and check the documentation site")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def public_modules() -> list:
    """``sparsenorm`` and every module of the library (not the experiments, not a private one)
    that declares ``__all__``."""
    modules = [sparsenorm]
    for info in pkgutil.walk_packages(sparsenorm.__path__, "sparsenorm."):
        parts = info.name.split(".")
        if parts[1] == "experiments" or any(p.startswith("_") for p in parts):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__"):
            modules.append(module)
    return modules


def docs_hooks():
    """docs/hooks.py (the site's MkDocs hook) as a module: its ``resolve`` names objects by path."""
    spec = importlib.util.spec_from_file_location("sparsenorm_docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_docs_tools
def test_every_public_name_has_an_api_entry(site):
    anchors = set()
    for page in (site / "api").rglob("*.html"):
        anchors.update(re.findall(r'id="(sparsenorm(?:\.\w+)+)"', page.read_text()))
    resolve = docs_hooks().resolve
    documented = set()
    for anchor in anchors:
        try:
            documented.add(id(resolve(anchor)))
        except (ImportError, AttributeError):
            pass  # a heading inside a docstring ("...--parameters"), not an object
    modules = public_modules()
    assert {m.__name__ for m in modules} >= {"sparsenorm", "sparsenorm.attention", "sparsenorm.losses",
                                              "sparsenorm.kernels", "sparsenorm.registry", "sparsenorm.hf",
                                              "sparsenorm.marginalize"}
    missing = [f"{module.__name__}.{name}" for module in modules for name in module.__all__
               if id(getattr(module, name)) not in documented]
    assert not missing, f"public names without an entry in the API reference (docs/api/*.md): {missing}"


@needs_docs_tools
def test_site_has_every_nav_page_and_the_generated_results(site):
    for page in ("index.html", "getting-started.html", "guide/errors.html", "api/normalizers.html",
                 "results/index.html", "results/full/cvae/report.html", "benchmarks/index.html",
                 "benchmarks/results.html"):
        assert (site / page).is_file(), page
    assert (site / "results/full/cvae/fig3_curves.png").is_file()  # the reports' figures come along
    assert not list(site.rglob("*bench*.py")) and not (site / "hooks.py").exists()


@needs_docs_tools
def test_search_works_from_disk_without_network(site):
    """Issue 50 item 7: the README opens the site from disk (file://), so its search must work there: the
    offline plugin's inlined index, the vendored WebWorker shim, and no script or font from the network."""
    assert (site / "search" / "search_index.js").read_text().startswith("var __index = {")
    for page in ("index.html", "guide/losses.html", "api/normalizers.html"):
        html = (site / page).read_text()
        scripts = re.findall(r'<script[^>]*\bsrc="([^"]+)"', html)
        assert scripts and not [s for s in scripts if s.startswith(("http:", "https:", "//"))], (page, scripts)
        assert any(s.endswith("javascripts/iframe-worker-shim.js") for s in scripts), page
        assert "fonts.googleapis" not in html and 'href="https://fonts' not in html, page
    assert (site / "javascripts" / "iframe-worker-shim.js").is_file()


def test_errors_table_messages_occur_in_the_source():
    """Each message fragment in docs/guide/errors.md is written by the code (so the table cannot drift)."""
    source = "\n".join(p.read_text() for p in (REPO / "sparsenorm").rglob("*.py"))
    messages_table = (REPO / "docs/guide/errors.md").read_text().split("\n## ", 1)[0]  # the second table is checked
    rows = [line for line in messages_table.splitlines()  # by tests/unit/test_bad_input.py
            if line.startswith("| ") and not line.startswith("| situation") and "---" not in line]
    assert len(rows) >= 20
    for row in rows:
        message = row.strip("| ").rsplit(" | ", 1)[-1]
        for fragment in re.findall(r"`([^`]+)`", message):
            assert fragment in source, f"errors.md quotes a message the code does not write: {fragment!r}"


def test_readme_links_resolve():
    text = (REPO / "README.md").read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text)
             if not link.startswith(("http://", "https://", "#"))]
    assert links
    assert [link for link in links if not (REPO / link).exists()] == []


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def test_readme_experiment_table_counts_match_the_generated_claims_index():
    """The README's per-experiment claim counts are those of results/README.md (generated), so the
    hand-written table cannot drift from the committed verdicts."""
    index = {}
    for line in (REPO / "results/README.md").read_text().splitlines():
        cells = _cells(line)
        if line.startswith("| ") and len(cells) >= 10 and cells[0].count(".") >= 2:
            verdict = regime.tally_key(cells[-2].strip("*"))  # a missed gate's verdict carries its figure
            index.setdefault(cells[0].split(".")[1], Counter())[verdict] += 1
    readme = {}
    for line in (REPO / "README.md").read_text().splitlines():
        cells = _cells(line)
        match = re.fullmatch(r"(\d+): (.*?)(?: \(.*\))?", cells[2]) if len(cells) == 4 else None
        if line.startswith("| `") and match:
            counts = Counter({verdict: int(n) for n, verdict in
                              (part.split(" ", 1) for part in match.group(2).split(", "))})
            assert sum(counts.values()) == int(match.group(1)), line
            readme[cells[0].strip("`")] = counts
    assert set(readme) == set(index) == {"cvae", "multilabel", "ssvae", "mt", "vqvae", "finetune", "llm"}
    assert readme == index

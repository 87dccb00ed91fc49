"""MkDocs hook: the committed results/ and benchmarks/ folders become pages of the site.

Their Markdown is generated (``sparsenorm reproduce --index results/``, the experiments' reports)
or kept beside the code it describes (benchmarks/README.md), so the site takes the files where
they are instead of a copy that could drift. A folder's README.md becomes its index page, and the
figures next to a report are copied with it, so the reports' relative links resolve. A link
from those files into docs/ (right when read on GitHub) is rewritten to where that page is on the site.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO_ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("results", "benchmarks")
SUFFIXES = {".md", ".png", ".svg"}


def on_files(files, config):
    for folder in FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES:
                files.append(File(path.relative_to(REPO_ROOT).as_posix(), str(REPO_ROOT), config["site_dir"],
                                  config["use_directory_urls"]))
    return files


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


def _importable(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


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

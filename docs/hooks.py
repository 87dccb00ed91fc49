"""MkDocs hook: the committed results/ and benchmarks/ folders become pages of the site.

Their Markdown is generated (``sparsenorm reproduce --index results/``, the experiments' reports)
or kept beside the code it describes (benchmarks/README.md), so the site takes the files where
they are instead of a copy that could drift. A folder's README.md becomes its index page, and the
figures next to a report are copied with it, so the reports' relative links resolve. A link
from those files into docs/ (right when read on GitHub) is rewritten to where that page is on the site.
"""
from __future__ import annotations

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
    if page.file.src_uri.startswith(tuple(f + "/" for f in FOLDERS)):
        depth = page.file.src_uri.count("/")
        markdown = markdown.replace("](" + "../" * depth + "docs/", "](" + "../" * depth)
    return markdown

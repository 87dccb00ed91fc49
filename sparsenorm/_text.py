"""Plain-text helpers shared by the CLI, the demo and the experiment reports."""
from __future__ import annotations

from typing import Any, Iterable, Sequence


class UserFacingError(Exception):
    """An error the CLI prints as one line (no traceback): bad option values, data that cannot be
    fetched (the message says which package to get or where to put the files)."""


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; floats are written with 3 decimals."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "n/a" if v != v else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)

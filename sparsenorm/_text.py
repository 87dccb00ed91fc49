"""Plain-text helpers shared by the CLI, the demo and the experiment reports."""
from __future__ import annotations

import argparse
from typing import Any, Callable, Iterable, Sequence


class UserFacingError(Exception):
    """An error the CLI prints as one line (no traceback): bad option values, data that cannot be
    fetched (the message says which package to get or where to put the files)."""


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse ``type`` for ``flag``: an integer >= 1, else an error naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type`` for options that must be a positive number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; floats are written with 3 decimals."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "n/a" if v != v else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)

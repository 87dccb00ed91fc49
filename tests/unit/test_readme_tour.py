"""The README's "A tour of the API" runs as written (issue 50, item 8): every name the tour lists is
there (the normalizer it shows has a log-probability function), and its entmax-named loss gives one
loss per row, as the entmax package's does."""
import re
import warnings
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def tour() -> str:
    text = README.read_text()
    start = text.index("## A tour of the API")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_tour_runs_and_lists_no_missing_function():
    torch.manual_seed(0)
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "kernels not built" on a machine without them
        exec(compile(tour(), str(README), "exec"), namespace)
    norm = namespace["norm"]
    listed = re.search(r"^norm\.forward, (.*)$", tour(), re.M).group(1)
    for attribute in ["forward", *[a.strip().removeprefix("norm.") for a in listed.split(",")]]:
        assert getattr(norm, attribute) is not None, attribute
    assert namespace["per_row"].shape == (2,)
    assert namespace["mha"].normalizer == "sparsemax"

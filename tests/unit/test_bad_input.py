"""Bad input gets a clear error naming the argument, at every public entry point (issue 25, item 4).

One table, :data:`ROWS`: each row is a call, the exception it must raise and the argument its
message must name. Rows for the arguments every normalizer and loss shares (an integer or complex
input, a mask of the wrong dtype or shape, ``dim`` out of range) are generated from the registry,
so a new normalizer is covered when it is registered; the rest are written out. Each row's
``case`` is a line of the errors page's table of cases (docs/guide/errors.md), and
:func:`test_readme_errors_table_matches_the_cases` keeps the two the same.
"""
from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
import torch

import sparsenorm as sn
from sparsenorm import registry
from sparsenorm.attention import MultiheadAttention, sparse_attention
from sparsenorm.marginalize import marginalize

ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "errors.md"


@dataclass(frozen=True)
class Row:
    case: str  # the errors page's wording of the input
    label: str  # which call, for the test id
    call: Callable[[], object]
    error: type
    argument: str  # must appear in the message


X = torch.randn(2, 4)
TARGET = torch.tensor([0, 3])
MULTI_TARGET = torch.tensor([[1.0, 0, 0, 1], [0, 1, 0, 0]])
Q, K, V = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
FIN = math.inf

INPUT = "integer or complex input"
MASK_DTYPE = "`mask` not boolean"
MASK_SHAPE = "`mask` that does not broadcast to the input"
DIM = "`dim` out of range"


def first_argument(fn) -> str:
    while isinstance(fn, partial):
        fn = fn.func
    return next(iter(inspect.signature(fn).parameters))


def owned(fn) -> bool:
    """Whether ``fn`` is sparsenorm's (the registry's softmax losses are ``torch``'s own)."""
    while isinstance(fn, partial):
        fn = fn.func
    return fn.__module__.startswith("sparsenorm")


def normalizer_forms():
    for name in registry.names():
        entry = registry.get(name)
        forms = {"forward": entry.forward, "train": entry.train_forward, "log": entry.log_prob}
        for form, fn in forms.items():
            if fn is not None:
                yield f"{name}.{form}", fn, entry.supports_mask
    yield "sparsemax_bisect", sn.sparsemax_bisect, True


def generated_rows():
    for label, fn, supports_mask in normalizer_forms():
        arg = first_argument(fn)
        yield Row(INPUT, f"{label}(int)", partial(fn, X.long()), TypeError, arg)
        yield Row(INPUT, f"{label}(complex)", partial(fn, X.to(torch.complex64)), TypeError, arg)
        yield Row(DIM, label, partial(fn, X, dim=2), IndexError, "dim")
        yield Row(DIM, f"{label}(dim=-3)", partial(fn, X, dim=-3), IndexError, "dim")
        if supports_mask:
            yield Row(MASK_DTYPE, label, partial(fn, X, mask=torch.ones(2, 4)), TypeError, "mask")
            yield Row(MASK_SHAPE, label, partial(fn, X, mask=torch.ones(3, 4, dtype=torch.bool)), ValueError, "mask")
    for name in registry.names():
        entry = registry.get(name)
        for kind, loss, target in (("single", entry.single_label_loss, TARGET),
                                   ("multi", entry.multi_label_loss, MULTI_TARGET)):
            if not owned(loss):
                continue
            arg = first_argument(loss)
            label = f"{name}.{kind}_label_loss"
            yield Row(INPUT, f"{label}(int)", partial(loss, X.long(), target), TypeError, arg)
            yield Row(INPUT, f"{label}(complex)", partial(loss, X.to(torch.complex64), target), TypeError, arg)
            yield Row("unknown `reduction`", label, partial(loss, X, target, reduction="avg"), ValueError, "reduction")
        if owned(entry.single_label_loss):
            label = f"{name}.single_label_loss"
            yield Row("class index out of range", label, partial(entry.single_label_loss, X, torch.tensor([0, 4])),
                      IndexError, "target")
            yield Row("target of the wrong shape", label, partial(entry.single_label_loss, X, torch.tensor([0, 1, 2])),
                      ValueError, "target")


def written_rows():
    x_int = X.long()
    mha = MultiheadAttention(8, 2, batch_first=True)
    q8 = torch.randn(2, 3, 8)
    return [
        # parameters
        Row("`alpha <= 0`", "entmax_bisect(alpha=0)", partial(sn.entmax_bisect, X, 0.0), ValueError, "alpha"),
        Row("`alpha <= 0`", "entmax_bisect(alpha=-0.5)", partial(sn.entmax_bisect, X, -0.5), ValueError, "alpha"),
        Row("`alpha <= 0`", "entmax_bisect(alpha per row)",
            partial(sn.entmax_bisect, X, torch.tensor([[1.5], [0.0]])), ValueError, "alpha"),
        Row("`alpha <= 0`", "entmax_bisect_loss", partial(sn.entmax_bisect_loss, X, TARGET, alpha=0.0),
            ValueError, "alpha"),
        Row("`alpha <= 0`", "EntmaxBisect", lambda: sn.EntmaxBisect(alpha=0.0)(X), ValueError, "alpha"),
        Row("`r` outside [0, 1]", "r_softmax(r=1.5)", partial(sn.r_softmax, X, 1.5), ValueError, "r"),
        Row("`r` outside [0, 1]", "r_softmax(r=-0.1)", partial(sn.r_softmax, X, -0.1), ValueError, "r"),
        Row("`r` outside [0, 1]", "r_softmax_loss", partial(sn.r_softmax_loss, X, TARGET, r=2.0), ValueError, "r"),
        Row("`r` outside [0, 1]", "RSoftmax", partial(sn.RSoftmax, r=2.0), ValueError, "r"),
        Row("`r` outside [0, 1]", "sparse_attention(r=1.5)",
            partial(sparse_attention, Q, K, V, normalizer="r_softmax", r=1.5), ValueError, "r"),
        Row("`t <= 0`", "t_softmax", partial(sn.t_softmax, X, 0.0), ValueError, "t"),
        Row("`t <= 0`", "t_softmax_loss", partial(sn.t_softmax_loss, X, TARGET, t=-1.0), ValueError, "t"),
        Row("`t <= 0`", "TSoftmax", partial(sn.TSoftmax, t=0.0), ValueError, "t"),
        Row("`q <= 0`", "sparsehourglass", partial(sn.sparsehourglass, X, q=0.0), ValueError, "q"),
        Row("`q <= 0`", "sparsehourglass_hinge_loss", partial(sn.sparsehourglass_hinge_loss, X, TARGET, q=-1.0),
            ValueError, "q"),
        Row("`eps < 0`", "ev_softmax_train", partial(sn.ev_softmax_train, X, eps=-1e-3), ValueError, "eps"),
        Row("`eps < 0`", "log_ev_softmax_train", partial(sn.log_ev_softmax_train, X, eps=-1e-3), ValueError, "eps"),
        Row("`eps < 0`", "ev_softmax_nll_loss", partial(sn.ev_softmax_nll_loss, X, TARGET, eps=-1.0), ValueError,
            "eps"),
        Row("`eps < 0`", "EvSoftmaxTrain", partial(sn.EvSoftmaxTrain, eps=-1.0), ValueError, "eps"),
        Row("NaN or infinite parameter", "t_softmax(t=inf)", partial(sn.t_softmax, X, FIN), ValueError, "t"),
        Row("NaN or infinite parameter", "t_softmax_loss(t=inf)", partial(sn.t_softmax_loss, X, TARGET, t=FIN),
            ValueError, "t"),
        Row("NaN or infinite parameter", "sparsehourglass(q=inf)", partial(sn.sparsehourglass, X, q=FIN),
            ValueError, "q"),
        Row("NaN or infinite parameter", "entmax_bisect(alpha=inf)", partial(sn.entmax_bisect, X, FIN),
            ValueError, "alpha"),
        Row("NaN or infinite parameter", "r_softmax(r=nan)", partial(sn.r_softmax, X, math.nan), ValueError, "r"),
        Row("NaN or infinite parameter", "t_softmax(t=tensor nan)", partial(sn.t_softmax, X, torch.tensor(math.nan)),
            ValueError, "t"),
        Row("NaN or infinite parameter", "ev_softmax_train(eps=inf)", partial(sn.ev_softmax_train, X, eps=FIN),
            ValueError, "eps"),
        Row("NaN or infinite parameter", "sparse_attention(scale=inf)", partial(sparse_attention, Q, K, V, scale=FIN),
            ValueError, "scale"),
        Row("NaN or infinite parameter", "sparse_attention(scale=nan)",
            partial(sparse_attention, Q, K, V, scale=math.nan), ValueError, "scale"),
        Row("`n_iter < 1`", "entmax_bisect", partial(sn.entmax_bisect, X, n_iter=0), ValueError, "n_iter"),
        Row("`n_iter < 1`", "sparsemax_bisect", partial(sn.sparsemax_bisect, X, n_iter=0), ValueError, "n_iter"),
        Row("`n_iter < 1`", "sparsemax_bisect_loss", partial(sn.sparsemax_bisect_loss, X, TARGET, n_iter=0),
            ValueError, "n_iter"),
        Row("`k < 1`", "sparsemax", partial(sn.sparsemax, X, k=0), ValueError, "k"),
        Row("`k < 1`", "entmax15", partial(sn.entmax15, X, k=0), ValueError, "k"),
        # attention
        Row(INPUT, "sparse_attention(int query)", partial(sparse_attention, Q.long(), K, V), TypeError, "query"),
        Row(INPUT, "sparse_attention(complex value)", partial(sparse_attention, Q, K, V.to(torch.complex64)),
            TypeError, "value"),
        Row("query, key and value of different dtypes", "sparse_attention", partial(sparse_attention, Q, K, V.double()),
            TypeError, "query, key and value"),
        Row("query and key feature sizes differ", "sparse_attention",
            partial(sparse_attention, Q, torch.randn(1, 2, 5, 3), V), ValueError, "query and key"),
        Row("key and value lengths differ", "sparse_attention",
            partial(sparse_attention, Q, K, torch.randn(1, 2, 6, 4)),
            ValueError, "key and value"),
        Row("key/value heads that do not divide the query heads", "sparse_attention",
            partial(sparse_attention, torch.randn(1, 3, 3, 4), K, V), ValueError, "key"),
        Row("batch dimensions that do not broadcast", "sparse_attention",
            partial(sparse_attention, torch.randn(2, 2, 3, 4), torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)),
            ValueError, "query, key and value"),
        Row("`attn_mask` of the wrong shape", "sparse_attention",
            partial(sparse_attention, Q, K, V, attn_mask=torch.ones(4, 5, dtype=torch.bool)), ValueError, "attn_mask"),
        Row("`attn_mask` of the wrong dtype", "sparse_attention",
            partial(sparse_attention, Q, K, V, attn_mask=torch.ones(3, 5, dtype=torch.long)), TypeError, "attn_mask"),
        Row("`dropout_p` outside [0, 1)", "sparse_attention", partial(sparse_attention, Q, K, V, dropout_p=1.0),
            ValueError, "dropout_p"),
        Row("unknown normalizer name (the message lists the valid ones)", "sparse_attention",
            partial(sparse_attention, Q, K, V, normalizer="softmaxx"), ValueError, "normalizer"),
        Row("unknown normalizer name (the message lists the valid ones)", "MultiheadAttention",
            partial(MultiheadAttention, 8, 2, normalizer="softmaxx"), ValueError, "normalizer"),
        Row("unknown normalizer name (the message lists the valid ones)", "registry.get",
            partial(registry.get, "softmaxx"), ValueError, "normalizer"),
        Row(INPUT, "MultiheadAttention(int query)", partial(mha, q8.long(), q8, q8), TypeError, "query"),
        Row("query, key or value features that do not match the module", "MultiheadAttention",
            partial(mha, torch.randn(2, 3, 7), torch.randn(2, 3, 7), torch.randn(2, 3, 7)), ValueError, "query"),
        Row("key and value lengths differ", "MultiheadAttention", partial(mha, q8, q8, torch.randn(2, 4, 8)),
            ValueError, "key and value"),
        Row("batch dimensions that do not broadcast", "MultiheadAttention",
            partial(mha, q8, torch.randn(3, 3, 8), torch.randn(3, 3, 8)), ValueError, "query and key"),
        Row("`key_padding_mask` of the wrong shape", "MultiheadAttention",
            partial(mha, q8, q8, q8, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
            "key_padding_mask"),
        Row("`attn_mask` of the wrong shape", "MultiheadAttention",
            partial(mha, q8, q8, q8, attn_mask=torch.zeros(3, 4, dtype=torch.bool)), ValueError, "attn_mask"),
        # marginalize, post-hoc evidential
        Row(INPUT, "marginalize(int probs)", partial(marginalize, x_int, lambda e, c: e.float()), TypeError, "probs"),
        Row(DIM, "marginalize", partial(marginalize, X, lambda e, c: e.float(), dim=2), IndexError, "dim"),
        Row("`fn` not callable", "marginalize", partial(marginalize, X, 3.0), TypeError, "fn"),
        Row("`max_batch < 1`", "marginalize", partial(marginalize, X, lambda e, c: e.float(), max_batch=0),
            ValueError, "max_batch"),
        Row(INPUT, "posthoc_evidential(int features)", partial(sn.posthoc_evidential, x_int, torch.randn(3, 4)),
            TypeError, "features"),
        Row("features and weight that do not match", "posthoc_evidential",
            partial(sn.posthoc_evidential, torch.randn(2, 3), torch.randn(4, 5)), ValueError, "features"),
    ]


ROWS = list(generated_rows()) + written_rows()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.case}|{r.label}" for r in ROWS])
def test_bad_input_raises_an_error_naming_the_argument(row):
    with pytest.raises(row.error) as info:
        row.call()
    assert re.search(rf"(?<![A-Za-z_]){re.escape(row.argument)}(?![A-Za-z_])", str(info.value)), (
        f"the message must name {row.argument!r}: {info.value}")


def test_unknown_normalizer_message_lists_every_valid_name():
    with pytest.raises(ValueError) as info:
        sparse_attention(Q, K, V, normalizer="softmaxx")
    for name in registry.names():
        assert name in str(info.value)


def readme_errors_table():
    """``{(case, error name): arguments}`` from the errors page's table of cases."""
    text = ERRORS_PAGE.read_text()
    section = text.split("\n## Each case, by the argument it names\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 3 and cells[0] not in ("input", "---"):
            rows[(cells[0], cells[1].strip("`"))] = cells[2]
    return rows


def test_readme_errors_table_matches_the_cases():
    readme = readme_errors_table()
    cases = {}
    for row in ROWS:
        cases.setdefault((row.case, row.error.__name__), set()).add(row.argument)
    assert set(readme) == set(cases), (
        f"errors-page rows without a test case: {sorted(set(readme) - set(cases))}; "
        f"test cases missing from the errors page: {sorted(set(cases) - set(readme))}")
    for key, arguments in cases.items():
        for argument in arguments:
            assert f"`{argument}`" in readme[key], f"errors-page row {key} must name `{argument}`"

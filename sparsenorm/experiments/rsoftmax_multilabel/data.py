"""Data for the multi-label experiment: the r-softmax paper's synthetic sets, yeast, and the user's own.

Every loader returns a :class:`MultilabelData`: float32 features and 0/1 int8 label matrices for a
training part and an evaluation part (the paper's "validation set" for synthetic data, the
standard test split for yeast), already standardised with the training part's statistics.

User data format (``--data-dir FILE``):

* **NPZ** (``numpy.savez``): ``X`` float array (n, d) and ``Y`` 0/1 array (n, L), L >= 2. Optional
  ``X_test`` / ``Y_test`` give a fixed evaluation split (otherwise a seeded 80/20 split is drawn),
  optional ``label_names`` (L,) strings.
* **CSV**: a header row; columns whose name starts with ``label`` (``label1``, ``label_cat``, ...) are
  the 0/1 labels, an optional column ``split`` holds ``train``/``test`` per row, every other column is
  a numeric feature.

Yeast (Elisseeff & Weston 2001; 2,417 genes x 103 features, 14 labels) ships in the Debian package
``r-cran-mlr`` as the R object ``yeast.task`` inside the lazy-load database ``data/Rdata.rdb``.
It is read without R (:mod:`.._shared.r_lazyload`). The package's version and SHA-256 are pinned
(:mod:`.._shared.artifacts`); it is fetched and verified by :func:`.._shared.provenance.fetch_artifact`.
The result is cached as ``yeast.npz`` (the NPZ format above, with the standard split) in
:func:`sparsenorm._cache.cache_dir` or ``--data-dir DIR``, with a provenance record naming what it was made from.
"""
from __future__ import annotations

import csv
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..._cache import cache_dir
from ..._text import UserFacingError
from .._shared import provenance
from .._shared.debian import extract_deb
from .._shared.r_lazyload import read_mlr_multilabel_task

SYNTHETIC_SAMPLES = 5000
SYNTHETIC_FEATURES = 128
SYNTHETIC_VALIDATION_FRACTION = 0.2

MLR_ARTIFACT = MLR_PACKAGE = "r-cran-mlr"
YEAST_OBJECT = "yeast.task"
YEAST_SHAPE = (2417, 103, 14)
# Mulan/LIBSVM's standard split: the first 1,500 rows are the training set, the last 917 the test
# set. The mlr rows are in that order: row 1,501 is the instance other public code uses as the
# first yeast test instance (features and labels agree).
YEAST_TRAIN_SIZE = 1500
YEAST_CACHE_NAME = "yeast.npz"


@dataclass
class MultilabelData:
    """One multi-label problem, split into a training part and an evaluation part."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    split: str
    """How the evaluation part was chosen, in words (goes into the report)."""
    label_names: List[str] = field(default_factory=list)
    meta: Dict[str, float] = field(default_factory=dict)

    @property
    def n_labels(self) -> int:
        return int(self.y_train.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    def summary(self) -> Dict[str, float]:
        return {
            "n_train": int(self.x_train.shape[0]), "n_eval": int(self.x_eval.shape[0]),
            "n_features": self.n_features, "n_labels": self.n_labels,
            "mean_labels_train": float(self.y_train.sum(1).mean()),
            "mean_labels_eval": float(self.y_eval.sum(1).mean()),
            **self.meta,
        }


def _standardise(x_train: np.ndarray, x_eval: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """z-score with the training part's mean and std (constant features are only centred)."""
    mean = x_train.mean(0)
    std = x_train.std(0)
    std[std == 0] = 1.0
    return ((x_train - mean) / std).astype(np.float32), ((x_eval - mean) / std).astype(np.float32)


def _seeded_split(n: int, eval_fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    n_eval = max(1, int(round(n * eval_fraction)))
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


# --------------------------------------------------------------------------------------------
# synthetic data (r-softmax paper, "Datasets" paragraph)


def sample_documents(p_c: np.ndarray, p_w_c: np.ndarray, n_samples: int, n_labels: float, length: float,
                     rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``make_multilabel_classification`` generative process (``allow_unlabeled=False``), vectorised.

    Per document: a label count ``k ~ Poisson(n_labels)`` redrawn until ``1 <= k <= C``; ``k``
    distinct classes, drawn as scikit-learn does (i.i.d. draws ``~ p_c``, duplicates dropped, until
    ``k`` are distinct: successive sampling without replacement, which is the Gumbel top-k of
    ``log p_c``); a length ``n ~ Poisson(length)`` redrawn until ``n > 0``; word counts
    ``~ Multinomial(n, mean of p_w_c's columns of those classes)``. The same distribution as
    scikit-learn's loop (``tests/experiments/test_multilabel_data.py`` compares them), whose
    duplicate rejection takes minutes per data set once most classes are drawn, rare ones included.
    Returns word counts ``(n_samples, n_features)`` and 0/1 labels ``(n_samples, C)``.
    """
    n_features, n_classes = p_w_c.shape
    sizes = rng.poisson(n_labels, n_samples)
    while (bad := (sizes < 1) | (sizes > n_classes)).any():
        sizes[bad] = rng.poisson(n_labels, int(bad.sum()))
    keys = np.log(p_c) + rng.gumbel(size=(n_samples, n_classes))
    ranks = np.argsort(np.argsort(-keys, axis=1), axis=1)
    y = (ranks < sizes[:, None]).astype(np.int64)
    words = rng.poisson(length, n_samples)
    while (empty := words == 0).any():
        words[empty] = rng.poisson(length, int(empty.sum()))
    mixture = (y @ p_w_c.T) / sizes[:, None]  # each column of p_w_c sums to 1
    x = rng.multinomial(words, mixture / mixture.sum(1, keepdims=True))
    return x, y


def make_synthetic(n_classes: int, n_labels: float, length: float, seed: int,
                   n_samples: int = SYNTHETIC_SAMPLES, n_features: int = SYNTHETIC_FEATURES) -> MultilabelData:
    """Synthetic multi-label documents as in the r-softmax paper (scikit-learn's ``make_multilabel_classification``).

    ``n_labels`` (average labels per example) and ``length`` (average document length, the sum of
    an example's features) are the Poisson means of the generator; 5,000 examples with 128 features,
    the first 80 % for training and the last 20 % as the validation set. Every example has at least
    one label (``allow_unlabeled=False``: the normalized label vector y/|y| needs one, and a sparse
    output always predicts at least one label). Features are word counts, z-scored with the training
    part's statistics (the paper does not say how it scaled them). The process is scikit-learn's,
    drawn by :func:`sample_documents` (same distribution, numpy's ``default_rng(seed)`` stream).
    """
    if not 0 < n_labels <= n_classes:
        raise ValueError(f"n_labels must be in (0, n_classes={n_classes}], got {n_labels}")
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    rng = np.random.default_rng(seed)
    p_c = rng.uniform(size=n_classes)  # class and word distributions drawn as scikit-learn does
    p_c /= p_c.sum()
    p_w_c = rng.uniform(size=(n_features, n_classes))
    p_w_c /= p_w_c.sum(0)
    x, y = sample_documents(p_c, p_w_c, n_samples, n_labels, length, rng)
    n_train = int(round(n_samples * (1 - SYNTHETIC_VALIDATION_FRACTION)))
    x_train, x_eval = _standardise(x[:n_train].astype(np.float64), x[n_train:].astype(np.float64))
    return MultilabelData(
        name=f"synthetic-L{n_classes}-labels{n_labels:g}-length{length:g}",
        x_train=x_train, y_train=y[:n_train].astype(np.int8), x_eval=x_eval, y_eval=y[n_train:].astype(np.int8),
        split=f"first {n_train} generated examples train, last {n_samples - n_train} validation",
        meta={"n_classes": n_classes, "n_labels_param": float(n_labels), "length_param": float(length)},
    )


def average_label_sweep(n_classes: int, quick: bool) -> List[int]:
    """Sweep (a): average number of labels (document length fixed at 2,000).

    The paper does not list its values (they are only in its Fig. 2); we use 10 % to 90 % of the
    classes: five points in full mode (10, 30, 50, 70, 90 %), three in quick mode (10, 50, 90 %).
    """
    fractions = (0.1, 0.5, 0.9) if quick else (0.1, 0.3, 0.5, 0.7, 0.9)
    return sorted({max(1, int(round(f * n_classes))) for f in fractions})


def document_length_sweep(quick: bool) -> List[int]:
    """Sweep (b): average document length (average labels fixed at half the classes).

    The paper does not list its values; we use 100 to 2,000 words (2,000 is the fixed length of
    sweep (a)), roughly log-spaced: five points in full mode, three in quick mode.
    """
    return [100, 500, 2000] if quick else [100, 250, 500, 1000, 2000]


# --------------------------------------------------------------------------------------------
# user data (NPZ / CSV)


def _fail(path: Path, problem: str) -> UserFacingError:
    return UserFacingError(
        f"{path}: {problem}. Expected an NPZ with X (n, d) float and Y (n, L) 0/1 (optional X_test, "
        f"Y_test, label_names), or a CSV with a header, 0/1 columns named label*, optional split "
        f"column (train/test) and numeric feature columns"
    )


def _check_arrays(path: Path, x, y, what: str) -> Tuple[np.ndarray, np.ndarray]:
    try:
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise _fail(path, f"X{what} is not numeric") from None
    try:
        y_float = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise _fail(path, f"Y{what} is not numeric") from None
    if x.ndim != 2 or y_float.ndim != 2:
        raise _fail(path, f"X{what} and Y{what} must be 2-D, got shapes {x.shape} and {y_float.shape}")
    if x.shape[0] != y_float.shape[0]:
        raise _fail(path, f"X{what} has {x.shape[0]} rows but Y{what} has {y_float.shape[0]}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise _fail(path, f"X{what} is empty (shape {x.shape})")
    if y_float.shape[1] < 2:
        raise _fail(path, f"Y{what} needs at least 2 label columns, got {y_float.shape[1]}")
    if not np.isfinite(x).all():
        raise _fail(path, f"X{what} contains NaN or infinite values")
    if not np.isin(y_float, (0.0, 1.0)).all():
        raise _fail(path, f"Y{what} must contain only 0 and 1")
    return x, y_float.astype(np.int8)


def _load_npz(path: Path) -> Tuple[np.ndarray, np.ndarray, Optional[Tuple[np.ndarray, np.ndarray]], List[str]]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zlib.error) as exc:
        raise _fail(path, f"cannot be read as NPZ ({exc})") from None
    missing = [k for k in ("X", "Y") if k not in arrays]
    if missing:
        raise _fail(path, f"missing array(s) {', '.join(missing)} (found: {', '.join(arrays) or 'none'})")
    x, y = _check_arrays(path, arrays["X"], arrays["Y"], "")
    test = None
    if ("X_test" in arrays) != ("Y_test" in arrays):
        raise _fail(path, "X_test and Y_test must be given together")
    if "X_test" in arrays:
        x_test, y_test = _check_arrays(path, arrays["X_test"], arrays["Y_test"], "_test")
        if x_test.shape[1] != x.shape[1] or y_test.shape[1] != y.shape[1]:
            raise _fail(path, f"X_test/Y_test have {x_test.shape[1]} features/{y_test.shape[1]} labels, "
                              f"X/Y have {x.shape[1]}/{y.shape[1]}")
        test = (x_test, y_test)
    names = [str(n) for n in arrays.get("label_names", [])]
    if names and len(names) != y.shape[1]:
        raise _fail(path, f"label_names has {len(names)} entries for {y.shape[1]} labels")
    return x, y, test, names


def _load_csv(path: Path) -> Tuple[np.ndarray, np.ndarray, Optional[Tuple[np.ndarray, np.ndarray]], List[str]]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(path, f"cannot be read as CSV ({exc})") from None
    if len(rows) < 2:
        raise _fail(path, "needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    label_cols = [i for i, h in enumerate(header) if h.lower().startswith("label")]
    split_cols = [i for i, h in enumerate(header) if h.lower() == "split"]
    feature_cols = [i for i in range(len(header)) if i not in label_cols and i not in split_cols]
    if not label_cols:
        raise _fail(path, "no label columns (their header must start with 'label')")
    if not feature_cols:
        raise _fail(path, "no feature columns")
    body = rows[1:]
    bad = [n + 2 for n, r in enumerate(body) if len(r) != len(header)]
    if bad:
        raise _fail(path, f"line {bad[0]} has a different number of fields than the header ({len(header)})")

    def numeric(cols: Sequence[int], what: str) -> np.ndarray:
        try:
            return np.array([[float(r[i]) for i in cols] for r in body], dtype=np.float64)
        except ValueError as exc:
            raise _fail(path, f"non-numeric {what} value ({exc})") from None

    x, y = _check_arrays(path, numeric(feature_cols, "feature"), numeric(label_cols, "label"), "")
    names = [header[i] for i in label_cols]
    if not split_cols:
        return x, y, None, names
    split = np.array([r[split_cols[0]].strip().lower() for r in body])
    if not np.isin(split, ("train", "test")).all():
        raise _fail(path, "the split column must hold 'train' or 'test' in every row")
    train, test = split == "train", split == "test"
    if not train.any() or not test.any():
        raise _fail(path, "the split column must mark at least one train and one test row")
    return x[train], y[train], (x[test], y[test]), names


def load_user_data(path: Path, seed: int = 0, eval_fraction: float = 0.2, name: Optional[str] = None) -> MultilabelData:
    """Load the user's own multi-label data (format in the module docstring).

    Without an explicit test part, a seeded split holds out ``eval_fraction`` of the rows. Raises
    :class:`UserFacingError` naming the problem for a missing, unreadable or malformed file.
    """
    path = Path(path)
    if not path.is_file():
        raise UserFacingError(f"{path}: no such file (give an .npz or .csv file with your multi-label data)")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        x, y, test, names = _load_npz(path)
    elif suffix == ".csv":
        x, y, test, names = _load_csv(path)
    else:
        raise _fail(path, f"unknown file type {suffix or '(none)'}; use .npz or .csv")
    if test is None:
        train_idx, eval_idx = _seeded_split(x.shape[0], eval_fraction, seed)
        if len(train_idx) == 0:
            raise _fail(path, "too few rows to split into train and test")
        test = (x[eval_idx], y[eval_idx])
        x, y = x[train_idx], y[train_idx]
        split = f"seeded split (seed {seed}): {len(train_idx)} train / {len(eval_idx)} test"
    else:
        split = f"the file's split: {x.shape[0]} train / {test[0].shape[0]} test"
    x_train, x_eval = _standardise(x, test[0])
    return MultilabelData(name=name or path.stem, x_train=x_train, y_train=y, x_eval=x_eval, y_eval=test[1],
                          split=split, label_names=names or [f"label{i + 1}" for i in range(y.shape[1])])


# --------------------------------------------------------------------------------------------
# yeast from Debian's r-cran-mlr (an R lazy-load database, read without R by _shared.r_lazyload)


_MLR_HOW_TO = (f"or download {MLR_PACKAGE}_*.deb by hand (https://packages.debian.org/stable/{MLR_PACKAGE}) "
               f"into the data folder (--data-dir DIR or $SPARSENORM_CACHE), or pass your own data with "
               f"--data-dir FILE.npz|FILE.csv")


_RDATA_HOW_TO = ("extract usr/lib/R/site-library/mlr/data/Rdata.rdb and Rdata.rdx into a folder yourself and pass "
                 "it with --data-dir DIR, or pass your own data with --data-dir FILE.npz|FILE.csv")


def _extract_rdata(deb: Path, workdir: Path) -> Tuple[Path, Path]:
    target = extract_deb(deb, workdir / "extracted", _RDATA_HOW_TO)
    rdbs = sorted(target.glob("**/mlr/data/Rdata.rdb"))
    if not rdbs:
        raise UserFacingError(f"could not unpack {deb}: no mlr/data/Rdata.rdb inside; {_RDATA_HOW_TO}")
    return rdbs[0], rdbs[0].with_suffix(".rdx")


def yeast_npz_from_rdata(rdb: Path, rdx: Path, target: Path) -> Path:
    """Parse yeast from mlr's lazy-load database and write it as an NPZ with the standard split."""
    x, y, _, label_names = read_mlr_multilabel_task(rdb, rdx, YEAST_OBJECT)
    if (x.shape[0], x.shape[1], y.shape[1]) != YEAST_SHAPE:
        raise UserFacingError(f"{rdb}: yeast.task has shape {x.shape[0]}x{x.shape[1]} with {y.shape[1]} labels, "
                              f"expected {YEAST_SHAPE[0]}x{YEAST_SHAPE[1]} with {YEAST_SHAPE[2]}; {_MLR_HOW_TO}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".part")
    with open(tmp, "wb") as handle:  # a file handle: np.savez would append .npz to the name
        np.savez_compressed(handle, X=x[:YEAST_TRAIN_SIZE], Y=y[:YEAST_TRAIN_SIZE], X_test=x[YEAST_TRAIN_SIZE:],
                            Y_test=y[YEAST_TRAIN_SIZE:], label_names=np.array(label_names))
    tmp.replace(target)  # atomic: a crash never leaves a half-written cache
    return target


def fetch_yeast(data_dir: Optional[Path] = None) -> Path:
    """Path of ``yeast.npz`` in ``data_dir`` (default :func:`sparsenorm._cache.cache_dir`), creating it if needed.

    Looks, in order, for a cached ``yeast.npz`` (with a provenance record that matches, or in a
    ``data_dir`` the user's own), then for ``Rdata.rdb``/``Rdata.rdx`` or an ``r-cran-mlr_*.deb``
    already in the folder (offline use), else fetches the pinned package.
    """
    folder = Path(data_dir) if data_dir is not None else cache_dir()
    target = folder / YEAST_CACHE_NAME
    if provenance.use_derived(target, "yeast cache (--data-dir)", user_folder=data_dir is not None):
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserFacingError(f"cannot create the data folder {folder}: {exc}; pass a writable folder with "
                              f"--data-dir DIR (or set $SPARSENORM_CACHE), or your own data with "
                              f"--data-dir FILE.npz|FILE.csv") from None
    rdb, rdx = folder / "Rdata.rdb", folder / "Rdata.rdx"
    if rdb.is_file() and rdx.is_file():
        provenance.record_user_path(folder, "mlr's Rdata.rdb/.rdx (--data-dir)", [rdb, rdx])
        yeast_npz_from_rdata(rdb, rdx, target)
        provenance.write_derived(target, [folder])
        return target
    deb = provenance.fetch_artifact(MLR_ARTIFACT, folder, how_to=_MLR_HOW_TO)
    with tempfile.TemporaryDirectory() as tmp:
        rdb, rdx = _extract_rdata(deb, Path(tmp))
        yeast_npz_from_rdata(rdb, rdx, target)
    provenance.write_derived(target, [deb])
    return target


def load_yeast(data_dir: Optional[Path] = None) -> MultilabelData:
    """Yeast with the standard 1,500 / 917 train/test split (fetched and cached on first use)."""
    data = load_user_data(fetch_yeast(data_dir), name="yeast")
    data.split = f"standard yeast split: {data.x_train.shape[0]} train / {data.x_eval.shape[0]} test"
    return data


def load_real_data(data_dir: Optional[Path] = None) -> MultilabelData:
    """``--data-dir FILE`` (.npz/.csv): the user's data; ``--data-dir DIR`` or none: yeast."""
    if data_dir is not None and Path(data_dir).suffix.lower() in (".npz", ".csv"):
        data = load_user_data(Path(data_dir))
        provenance.record_user_path(Path(data_dir), "multi-label data (--data-dir)")
        return data
    return load_yeast(data_dir)

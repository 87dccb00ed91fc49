"""Data for the multi-label experiment: synthetic generator, user NPZ/CSV files, the mlr/yeast parser.

The yeast parser is tested on a small R lazy-load database built here (no network, no R): an
entry for the task object that refers to an environment ``env::1`` and the environment's entry
holding a data frame with numeric features and logical labels, as in Debian's r-cran-mlr.
"""
from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from sparsenorm.experiments._shared import r_lazyload
from sparsenorm.experiments.rsoftmax_multilabel import data as md, paper
from sparsenorm._text import UserFacingError

# ------------------------------------------------------------------ a minimal R serializer (XDR)

NILVALUE, REFSXP, PERSISTSXP = 254, 255, 247
SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
IS_OBJECT, HAS_ATTR, HAS_TAG = 1 << 8, 1 << 9, 1 << 10
NA_INTEGER = -(2 ** 31)


def _int(v: int) -> bytes:
    return struct.pack(">i", v)


def _charsxp(text: str) -> bytes:
    data = text.encode()
    return _int(CHARSXP | (64 << 12)) + _int(len(data)) + data  # 64 << 12: the ASCII flag


def _strsxp(values) -> bytes:
    return _int(STRSXP) + _int(len(values)) + b"".join(_charsxp(v) for v in values)


def _attributes(pairs) -> bytes:
    out = b""
    for tag, value in pairs:
        out += _int(LISTSXP | HAS_TAG) + _int(SYMSXP) + _charsxp(tag) + value
    return out + _int(NILVALUE)


def _named_list(items, extra_attrs=(), is_object=False) -> bytes:
    body = _int(VECSXP | HAS_ATTR | (IS_OBJECT if is_object else 0)) + _int(len(items)) + b"".join(v for _, v in items)
    return body + _attributes([("names", _strsxp([k for k, _ in items])), *extra_attrs])


def _data_frame(columns) -> bytes:
    n = len(next(iter(columns.values())))
    items = []
    for name, values in columns.items():
        if values.dtype == bool:
            items.append((name, _int(LGLSXP) + _int(n) + b"".join(_int(int(v)) for v in values)))
        else:
            items.append((name, _int(REALSXP) + _int(n) + b"".join(struct.pack(">d", v) for v in values)))
    row_names = _int(INTSXP) + _int(2) + _int(NA_INTEGER) + _int(-n)  # compact row names 1..n
    return _named_list(items, [("class", _strsxp(["data.frame"])), ("row.names", row_names)], is_object=True)


def _serialize(obj: bytes) -> bytes:
    header = b"X\n" + _int(3) + _int(0x040201) + _int(0x030500) + _int(5) + b"UTF-8"
    return header + obj


def _entry(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + zlib.compress(payload)


def _offsets(value) -> bytes:
    return _int(INTSXP) + _int(2) + _int(value[0]) + _int(value[1])


def write_mlr_fixture(folder: Path, x: np.ndarray, y: np.ndarray, object_name: str = "yeast.task") -> None:
    """``Rdata.rdb``/``Rdata.rdx`` holding ``object_name`` (a task referring to env::1) and env::1."""
    columns = {f"label{j + 1}": y[:, j].astype(bool) for j in range(y.shape[1])}
    columns.update({f"x{j + 1}": x[:, j] for j in range(x.shape[1])})
    env = _named_list([("bindings", _named_list([("data", _data_frame(columns))])),
                       ("locked", _int(LGLSXP) + _int(1) + _int(0))])
    persist = _int(PERSISTSXP) + _int(0) + _int(1) + _charsxp("env::1")
    task = _named_list([("type", _strsxp(["multilabel"])), ("env", persist)])
    env_entry, task_entry = _entry(_serialize(env)), _entry(_serialize(task))
    (folder / "Rdata.rdb").write_bytes(env_entry + task_entry)
    index = _named_list([
        ("variables", _named_list([(object_name, _offsets((len(env_entry), len(task_entry))))])),
        ("references", _named_list([("env::1", _offsets((0, len(env_entry))))])),
        ("compressed", _int(LGLSXP) + _int(1) + _int(1)),
    ])
    (folder / "Rdata.rdx").write_bytes(gzip.compress(_serialize(index)))


# ------------------------------------------------------------------ synthetic data


def test_synthetic_matches_the_papers_setting():
    data = md.make_synthetic(n_classes=10, n_labels=5, length=2000, seed=0)
    assert data.x_train.shape == (4000, 128) and data.x_eval.shape == (1000, 128)
    assert data.y_train.shape == (4000, 10) and data.y_eval.shape == (1000, 10)
    assert set(np.unique(data.y_train)) <= {0, 1}
    assert data.y_train.sum(1).min() >= 1 and data.y_eval.sum(1).min() >= 1  # no unlabeled example
    # Poisson(5) truncated to 1..10: mean a little below 5
    assert 4.5 < data.y_train.sum(1).mean() < 5.2
    # z-scored with the training statistics
    np.testing.assert_allclose(data.x_train.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(data.x_train.std(0), 1, atol=1e-3)


def test_synthetic_label_count_and_length_follow_the_parameters():
    few = md.make_synthetic(20, 2, 2000, seed=1, n_samples=600)
    many = md.make_synthetic(20, 10, 2000, seed=1, n_samples=600)
    assert few.y_train.sum(1).mean() < 3 < 8 < many.y_train.sum(1).mean()


def test_sampler_has_scikit_learns_distribution():
    """Given scikit-learn's class and word distributions, the vectorised sampler's documents have the
    same statistics as ``make_multilabel_classification``'s own (20,000 documents each)."""
    from sklearn.datasets import make_multilabel_classification

    n, n_classes, n_labels, length = 20_000, 5, 3, 40
    x_ref, y_ref, p_c, p_w_c = make_multilabel_classification(
        n_samples=n, n_features=6, n_classes=n_classes, n_labels=n_labels, length=length, allow_unlabeled=False,
        return_distributions=True, random_state=0)
    x, y = md.sample_documents(p_c, p_w_c, n, n_labels, length, np.random.default_rng(1))
    assert x.shape == x_ref.shape and y.shape == y_ref.shape and y.sum(1).min() >= 1 and x.sum(1).min() >= 1

    def label_counts(labels):
        return np.bincount(labels.sum(1), minlength=n_classes + 1) / n

    # Frequencies over 20,000 documents: a standard error below 0.0036, so 0.015 is > 4 of them.
    np.testing.assert_allclose(label_counts(y), label_counts(y_ref), atol=0.015)
    np.testing.assert_allclose(y.mean(0), y_ref.mean(0), atol=0.015)  # each class's frequency
    np.testing.assert_allclose(y.T @ y / n, y_ref.T @ y_ref / n, atol=0.015)  # co-occurrence
    np.testing.assert_allclose(x.sum(1).mean(), x_ref.sum(1).mean(), rtol=0.01)  # document length
    np.testing.assert_allclose(x.mean(0), x_ref.mean(0), rtol=0.03)  # each word's mean count
    first = y[:, 0] == 1  # words depend on the labels: documents with class 0
    np.testing.assert_allclose(x[first].mean(0), x_ref[y_ref[:, 0] == 1].mean(0), rtol=0.05)


def test_synthetic_is_seeded():
    a = md.make_synthetic(10, 3, 500, seed=7, n_samples=200)
    b = md.make_synthetic(10, 3, 500, seed=7, n_samples=200)
    c = md.make_synthetic(10, 3, 500, seed=8, n_samples=200)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.y_train, c.y_train)


def test_synthetic_rejects_bad_parameters():
    with pytest.raises(ValueError, match="n_labels"):
        md.make_synthetic(10, 11, 2000, seed=0)
    with pytest.raises(ValueError, match="length"):
        md.make_synthetic(10, 3, 0, seed=0)


def test_sweeps():
    for quick in (True, False):
        for n_classes in paper.CLASS_COUNTS:
            values = md.average_label_sweep(n_classes, quick)
            assert values == sorted(values) and 1 <= values[0] and values[-1] < n_classes
        lengths = md.document_length_sweep(quick)
        assert paper.FIXED_DOCUMENT_LENGTH in lengths
    assert len(md.average_label_sweep(10, True)) < len(md.average_label_sweep(30, False))


# ------------------------------------------------------------------ user data


def _toy(n=30, d=4, labels=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), (rng.random((n, labels)) < 0.4).astype(int)


def test_user_npz_with_seeded_split(tmp_path):
    x, y = _toy()
    np.savez(tmp_path / "mine.npz", X=x, Y=y)
    data = md.load_user_data(tmp_path / "mine.npz", seed=3)
    assert data.x_train.shape == (24, 4) and data.x_eval.shape == (6, 4)
    assert data.y_train.dtype == np.int8 and data.label_names == ["label1", "label2", "label3"]
    assert "seeded split (seed 3)" in data.split
    again = md.load_user_data(tmp_path / "mine.npz", seed=3)
    np.testing.assert_array_equal(data.y_eval, again.y_eval)
    # train and held-out parts partition the file's rows
    both = np.concatenate([data.y_train, data.y_eval])
    assert sorted(map(tuple, both.tolist())) == sorted(map(tuple, y.tolist()))


def test_user_npz_with_explicit_test_part(tmp_path):
    x, y = _toy(n=40)
    np.savez(tmp_path / "mine.npz", X=x[:30], Y=y[:30], X_test=x[30:], Y_test=y[30:],
             label_names=np.array(["a", "b", "c"]))
    data = md.load_user_data(tmp_path / "mine.npz")
    np.testing.assert_array_equal(data.y_eval, y[30:])
    assert data.label_names == ["a", "b", "c"]
    mean, std = x[:30].mean(0), x[:30].std(0)
    np.testing.assert_allclose(data.x_eval, (x[30:] - mean) / std, rtol=1e-5, atol=1e-5)


def test_user_csv(tmp_path):
    x, y = _toy(n=10, d=2, labels=2)
    split = ["train"] * 7 + ["test"] * 3
    lines = ["f1,label_a,f2,label_b,split"]
    lines += [f"{x[i, 0]},{y[i, 0]},{x[i, 1]},{y[i, 1]},{split[i]}" for i in range(10)]
    (tmp_path / "mine.csv").write_text("\n".join(lines) + "\n")
    data = md.load_user_data(tmp_path / "mine.csv")
    assert data.x_train.shape == (7, 2) and data.x_eval.shape == (3, 2)
    np.testing.assert_array_equal(data.y_eval, y[7:])
    assert data.label_names == ["label_a", "label_b"]


@pytest.mark.parametrize("make, message", [
    (lambda p: np.savez(p / "f.npz", X=np.ones((5, 2))), "missing array"),
    (lambda p: np.savez(p / "f.npz", X=np.ones((5, 2)), Y=np.full((5, 2), 2)), "only 0 and 1"),
    (lambda p: np.savez(p / "f.npz", X=np.ones((5, 2)), Y=np.ones((4, 2))), "rows"),
    (lambda p: np.savez(p / "f.npz", X=np.ones((5, 2)), Y=np.ones((5, 1))), "at least 2 label"),
    (lambda p: np.savez(p / "f.npz", X=np.full((5, 2), np.nan), Y=np.ones((5, 2))), "NaN"),
    (lambda p: np.savez(p / "f.npz", X=np.ones(5), Y=np.ones((5, 2))), "2-D"),
    (lambda p: np.savez(p / "f.npz", X=np.ones((5, 2)), Y=np.ones((5, 2)), X_test=np.ones((2, 2))), "together"),
    (lambda p: (p / "f.npz").write_bytes(b"not a zip"), "cannot be read"),
    (lambda p: (p / "f.csv").write_text("a,b\n1,2\n"), "no label columns"),
    (lambda p: (p / "f.csv").write_text("a,label1,label2\n1,0,1\n2,x,1\n"), "non-numeric"),
    (lambda p: (p / "f.csv").write_text("a,label1,label2\n1,0,1\n2,1\n"), "number of fields"),
    (lambda p: (p / "f.csv").write_text("a,label1,label2,split\n1,0,1,train\n2,1,1,dev\n"), "split column"),
    (lambda p: (p / "f.txt").write_text("1 2 3"), "unknown file type"),
])
def test_malformed_user_files_raise_a_clear_error(tmp_path, make, message):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(UserFacingError, match=message) as info:
        md.load_user_data(path)
    assert str(path) in str(info.value)


def test_missing_user_file(tmp_path):
    with pytest.raises(UserFacingError, match="no such file"):
        md.load_user_data(tmp_path / "absent.npz")


def test_load_real_data_dispatches_on_the_path(tmp_path):
    x, y = _toy()
    np.savez(tmp_path / "mine.npz", X=x, Y=y)
    assert md.load_real_data(tmp_path / "mine.npz").name == "mine"


# ------------------------------------------------------------------ yeast (mlr lazy-load database)


def test_mlr_parser_on_a_fixture(tmp_path):
    pytest.importorskip("rdata")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 3)), (rng.random((6, 4)) < 0.5)
    write_mlr_fixture(tmp_path, x, y)
    got_x, got_y, features, labels = r_lazyload.read_mlr_multilabel_task(tmp_path / "Rdata.rdb", tmp_path / "Rdata.rdx",
                                                                         "yeast.task")
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y.astype(np.int8))
    assert features == ["x1", "x2", "x3"] and labels == ["label1", "label2", "label3", "label4"]
    with pytest.raises(KeyError, match="yeast.task"):
        r_lazyload.read_mlr_multilabel_task(tmp_path / "Rdata.rdb", tmp_path / "Rdata.rdx", "other.task")


def test_yeast_cache_from_rdata_files_checks_the_shape(tmp_path):
    """fetch_yeast uses Rdata.rdb/.rdx found in the data folder; a wrong shape is a clear error."""
    pytest.importorskip("rdata")
    rng = np.random.default_rng(1)
    write_mlr_fixture(tmp_path, rng.normal(size=(6, 3)), rng.random((6, 4)) < 0.5)
    with pytest.raises(UserFacingError, match="expected 2417x103"):
        md.fetch_yeast(tmp_path)
    assert not (tmp_path / md.YEAST_CACHE_NAME).exists()


def test_yeast_cache_has_the_standard_split(tmp_path, monkeypatch):
    pytest.importorskip("rdata")
    n, d, labels = md.YEAST_SHAPE
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(n, d)), rng.random((n, labels)) < 0.3
    y[:, 0] = True
    write_mlr_fixture(tmp_path, x, y)
    data = md.load_yeast(tmp_path)
    assert (tmp_path / md.YEAST_CACHE_NAME).is_file()
    assert data.x_train.shape == (1500, d) and data.x_eval.shape == (917, d)
    np.testing.assert_array_equal(data.y_eval, y[1500:].astype(np.int8))
    assert "standard yeast split" in data.split
    # the cache is used from now on, without the database
    (tmp_path / "Rdata.rdb").unlink()
    assert md.load_yeast(tmp_path).x_train.shape == (1500, d)


def _package_in_the_default_cache(monkeypatch, content: bytes = b"the pinned package") -> Path:
    """r-cran-mlr as after the main job: pinned (to fake bytes) and already in the default artifact cache
    (this test's own, tests/conftest.py), where fetch_yeast finds it whatever its data folder."""
    import hashlib
    from dataclasses import replace

    from sparsenorm.experiments._shared import artifacts, provenance

    pinned = b"the pinned package"
    monkeypatch.setitem(artifacts.ARTIFACTS, md.MLR_ARTIFACT, replace(
        artifacts.ARTIFACTS[md.MLR_ARTIFACT], sha256=hashlib.sha256(pinned).hexdigest(), size=len(pinned)))
    cached = provenance.artifact_dir() / artifacts.ARTIFACTS[md.MLR_ARTIFACT].filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(content)
    return cached


def _dpkg_deb(monkeypatch, returncode: int, stderr: str = ""):
    import subprocess

    from sparsenorm.experiments._shared import debian

    monkeypatch.setattr(debian.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(debian.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, returncode, "",
                                                                                              stderr))


def _no_tool(monkeypatch):
    from sparsenorm.experiments._shared import debian, provenance

    monkeypatch.setattr(debian.shutil, "which", lambda name: None)
    monkeypatch.setattr(provenance.shutil, "which", lambda name: None)


# Every step of fetch_yeast that can fail, each from the state of the caches where it is reached.
FETCH_FAILURES = {
    "no apt-get, nothing cached": (lambda mp, tmp: _no_tool(mp), "apt-get is not available"),
    "cached package, no dpkg-deb": (lambda mp, tmp: (_package_in_the_default_cache(mp), _no_tool(mp)),
                                    "dpkg-deb is needed"),
    "cached package, dpkg-deb fails": (lambda mp, tmp: (_package_in_the_default_cache(mp),
                                                        _dpkg_deb(mp, 2, "not a Debian format archive")),
                                       "not a Debian format archive"),
    "cached package without the data": (lambda mp, tmp: (_package_in_the_default_cache(mp), _dpkg_deb(mp, 0)),
                                        "no mlr/data/Rdata.rdb inside"),
    "cached package of other bytes": (lambda mp, tmp: _package_in_the_default_cache(mp, b"other bytes"),
                                      "SHA-256 mismatch"),
    "artifact folder cannot be made": (lambda mp, tmp: ((tmp / "data").mkdir(), (tmp / "data" / "artifacts")
                                                        .write_text("a file")), "cannot create the cache folder"),
}


@pytest.mark.parametrize("step", list(FETCH_FAILURES))
def test_failed_fetch_says_what_to_do(tmp_path, monkeypatch, step):
    """Issue 50 item 6: at every step where fetching yeast can fail, the message names --data-dir, whatever the
    caches hold (the main job leaves r-cran-mlr in the artifact cache: the dpkg-deb step is then the first)."""
    prepare, what = FETCH_FAILURES[step]
    prepare(monkeypatch, tmp_path)
    with pytest.raises(UserFacingError, match=what) as info:
        md.fetch_yeast(tmp_path / "data")
    assert "--data-dir" in str(info.value), str(info.value)


def test_data_folder_that_cannot_be_made_says_what_to_do(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UserFacingError, match="cannot create the data folder") as info:
        md.fetch_yeast(tmp_path / "file" / "data")
    assert "--data-dir" in str(info.value)

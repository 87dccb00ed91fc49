"""Every experiment trains on the device: one training step each through ``sparsenorm reproduce
<experiment> --quick --device cuda`` on the tiny data sets of the CPU tests (tests/experiments), with
a hook on every optimizer step that records where the parameters live. Checks: the run finishes
and writes its results, at least one optimizer step ran, and every step updated parameters on the
device (the model is there; its inputs must be too, or the step would have failed)."""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from torch.optim.optimizer import register_optimizer_step_pre_hook

pytestmark = pytest.mark.cuda

EXPERIMENT_TESTS = Path(__file__).resolve().parents[1] / "experiments"


def cpu_test_module(stem: str):
    """A module of tests/experiments (its data writers and tiny settings), loaded by path under its
    own name; skips where that module skips (a missing extra)."""
    name = f"_cpu_experiments_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXPERIMENT_TESTS / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


@pytest.fixture
def steps_on(device, monkeypatch, tmp_path):
    """The devices of the parameters of every optimizer step taken while the test runs."""
    monkeypatch.setenv("SPARSENORM_NO_PROGRESS", "1")
    monkeypatch.setenv("SPARSENORM_CACHE", str(tmp_path / "cache"))
    seen = []

    def record(optimizer, args, kwargs):
        seen.append({p.device.type for group in optimizer.param_groups for p in group["params"]})

    handle = register_optimizer_step_pre_hook(record)
    yield seen
    handle.remove()


def check(seen, device, out: Path, experiment: str):
    assert seen, "no optimizer step ran"
    assert all(devices == {device} for devices in seen), f"parameters off {device}: {seen}"
    assert json.loads((out / experiment / "results.json").read_text())["experiment"] == experiment


def reproduce(argv):
    from sparsenorm import cli

    assert cli.main(["reproduce", *argv]) == 0


@pytest.fixture
def tiny_mnist(tmp_path):
    folder = tmp_path / "mnist"
    folder.mkdir()
    return cpu_test_module("conftest").write_tiny_mnist(folder, 600, 100, 100).parent


def test_cvae_one_step(device, steps_on, tiny_mnist, tmp_path):
    reproduce(["cvae", "--quick", "--seeds", "1", "--normalizers", "softmax,ev_softmax", "--device", device,
               "--data-dir", str(tiny_mnist), "--max-steps", "1", "--eval-every", "1", "--workers", "1",
               "--out", str(tmp_path / "out")])
    check(steps_on, device, tmp_path / "out", "cvae")


def test_ssvae_one_step(device, steps_on, tiny_mnist, tmp_path):
    reproduce(["ssvae", "--quick", "--device", device, "--seeds", "1", "--epochs", "1", "--normalizers",
               "softmax,ev_softmax", "--data-dir", str(tiny_mnist), "--out", str(tmp_path / "out"),
               "--pretrain-epochs", "1", "--steps-per-epoch", "1", "--workers", "1"])
    check(steps_on, device, tmp_path / "out", "ssvae")


def test_translation_one_step(device, steps_on, tmp_path, monkeypatch):
    data = cpu_test_module("test_translation").write_parallel(tmp_path / "data")
    from sparsenorm.experiments._shared.runner import RunOptions
    from sparsenorm.experiments.evsoftmax_translation import EXPERIMENT

    # In this process, where the hook sees the steps (on CPU the runner would use two workers).
    monkeypatch.setattr(EXPERIMENT, "run_options", lambda settings, device: RunOptions(threads=1, workers=1))
    reproduce(["mt", "--quick", "--device", device, "--data-dir", str(data), "--max-steps", "1",
               "--normalizers", "softmax,ev_softmax", "--test-size", "4", "--out", str(tmp_path / "out")])
    check(steps_on, device, tmp_path / "out", "mt")


def test_vqvae_one_step(device, steps_on, tmp_path, monkeypatch):
    vq_tests = cpu_test_module("test_vqvae")
    from sparsenorm.experiments._shared.runner import RunOptions
    from sparsenorm.experiments.evsoftmax_vqvae import EXPERIMENT
    from sparsenorm.experiments.evsoftmax_vqvae import experiment as vq_experiment

    monkeypatch.setattr(vq_experiment, "QUICK", vq_tests.TINY)
    monkeypatch.setattr(EXPERIMENT, "run_options", lambda settings, device: RunOptions(threads=1, workers=1))
    data = tmp_path / "data"
    vq_tests.write_fake_idx(data)
    reproduce(["vqvae", "--quick", "--device", device, "--data-dir", str(data), "--max-steps", "1",
               "--out", str(tmp_path / "out")])
    check(steps_on, device, tmp_path / "out", "vqvae")


def test_multilabel_one_step(device, steps_on, tmp_path, monkeypatch):
    ml_tests = cpu_test_module("test_multilabel")
    from sparsenorm.experiments.rsoftmax_multilabel import experiment

    monkeypatch.setattr(experiment, "average_label_sweep", lambda n_classes, quick: [n_classes // 2])
    monkeypatch.setattr(experiment, "document_length_sweep", lambda quick: [2000])
    monkeypatch.setattr(experiment, "make_synthetic", functools.partial(experiment.make_synthetic, n_samples=200))
    reproduce(["multilabel", "--quick", "--seeds", "1", "--epochs", "1", "--max-steps", "1", "--device", device,
               "--data-dir", str(ml_tests._user_file(tmp_path)), "--workers", "1", "--class-counts", "10",
               "--hourglass-q", "10", "--out", str(tmp_path / "out")])
    check(steps_on, device, tmp_path / "out", "multilabel")


def test_finetune_one_step(device, steps_on, tmp_path, monkeypatch):
    ft_tests = cpu_test_module("test_finetune")
    from sparsenorm.experiments._shared import runner
    from sparsenorm.experiments._shared.runner import RunConfig
    from sparsenorm.experiments.rsoftmax_finetune.experiment import FinetuneExperiment

    (tmp_path / "bert").mkdir()
    (tmp_path / "sst").mkdir()
    model_dir, tsv = ft_tests.write_tiny_bert(tmp_path / "bert"), ft_tests.write_tiny_tsv(tmp_path / "sst")
    exp = FinetuneExperiment()
    monkeypatch.setattr(exp, "run_options", lambda settings, device: runner.RunOptions(threads=1, workers=1))
    config = RunConfig(out=tmp_path / "out", quick=True, device=device, data_dir=tsv, max_steps=1,
                       normalizers=["softmax", "ev_softmax"],
                       extra={"model_dir": model_dir, "r_finals": [0.5], "max_length": 24})
    out = runner.run_experiment(exp, config)
    assert steps_on and all(devices == {device} for devices in steps_on), steps_on
    assert json.loads((out / "results.json").read_text())["results"]["summary"]["normalizers"]

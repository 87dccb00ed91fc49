"""scripts/gpu_check.py's own logic, on CPU: arguments, the no-CUDA exit, stage time limits, the
pytest outcome parser, and the summary and result files written from a fake run."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up by name
spec.loader.exec_module(gpu_check)


def test_arguments_and_defaults(monkeypatch):
    monkeypatch.setenv("OUT", "/somewhere/out")
    args = gpu_check.parse_args([])
    assert args.out == "/somewhere/out" and args.budget == 480 and args.skip == [] and args.workers == 4
    monkeypatch.delenv("OUT")
    assert gpu_check.parse_args([]).out == "gpu-check-out"
    args = gpu_check.parse_args(["--out", "x", "--budget", "60", "--skip", "bench-attention", "--skip", "wheels"])
    assert (args.out, args.budget, args.skip) == ("x", 60, ["bench-attention", "wheels"])
    # The stages that prove and measure (failing tests first, the suite's shards, the dispatch
    # benchmark) fit the default budget; the later ones are cut to what is left.
    limits = gpu_check.LIMITS
    assert (limits["environment"] + limits["wheels"] + limits["failing-first"] + gpu_check.SHARDS * limits["cuda-suite"]
            + limits["bench-dispatch"]) <= 480


def test_a_stage_limit_can_be_overridden():
    args = gpu_check.parse_args(["--limit", "cuda-suite=120"])
    assert args.limits["cuda-suite"] == 120 and args.limits["bench-attention"] == gpu_check.LIMITS["bench-attention"]


def test_the_cuda_suite_can_be_narrowed_to_a_selection(monkeypatch, tmp_path):
    """--select reaches the CUDA suite's pytest as -k (and only that stage's)."""
    commands = {}
    monkeypatch.setattr(gpu_check, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "environment", lambda env, out, limit: {"device": "Fake GPU", "torch": "x"})
    monkeypatch.setattr(gpu_check, "run_stage", lambda name, command, limit, env, log=None:
                        commands.setdefault(name, command) and gpu_check.Stage(name, "passed", 0.0, "1 passed"))
    skips = [arg for name in ("wheels", "bench-dispatch", *gpu_check.BENCH_PARTS) for arg in ("--skip", name)]
    gpu_check.main(["--out", str(tmp_path), "--select", "flash or vqvae", *skips])
    suite = commands["cuda-suite"]
    assert suite[suite.index("-k") + 1] == "flash or vqvae" and suite[-1] == "tests/cuda"
    assert "-k" not in commands["triton-tests"]
    assert gpu_check.parse_args([]).select is None


@pytest.mark.parametrize("argv", [["--budget", "0"], ["--skip", "nonsense"], ["--workers", "-1"], ["--select", " "],
                                  ["--limit", "nonsense=3"], ["--limit", "cuda-suite=-1"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as err:
        gpu_check.parse_args(argv)
    assert err.value.code == 2
    assert argv[0].lstrip("-") in capsys.readouterr().err


def test_without_cuda_one_line_and_exit_zero(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "cuda_unavailable_reason", lambda: "no CUDA device (test)")
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "no CUDA device (test)" in printed
    assert not (tmp_path / "out").exists()  # nothing written


def test_this_machine_reason_is_consistent():
    import torch

    reason = gpu_check.cuda_unavailable_reason()
    assert (reason is None) == torch.cuda.is_available()


def test_stage_runs_records_and_times_out(tmp_path):
    log = tmp_path / "log"
    env = {"PATH": "/usr/bin:/bin"}
    ok = gpu_check.run_stage("echo", [sys.executable, "-c", "print('hello')"], 30, env, log)
    assert ok.status == "passed" and "hello" in log.read_text()
    bad = gpu_check.run_stage("fail", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], 30, env, log)
    assert bad.status == "failed" and bad.detail == "exit status 3" and bad.failures == ["boom"]
    slow = gpu_check.run_stage("slow", [sys.executable, "-c", "import time; time.sleep(30)"], 1, env, log)
    assert slow.status == "timeout" and slow.seconds < 10


def test_pytest_outcome_and_failures_are_read_from_the_log():
    log = ("....F.s\nFAILED tests/cuda/test_x.py::test_a[1] - AssertionError: off\n"
           "ERROR tests/cuda/test_y.py::test_b\n3 passed, 1 failed, 1 skipped, 1 error in 12.50s\n")
    assert gpu_check.pytest_outcome(log) == "3 passed, 1 failed, 1 skipped, 1 error"
    assert gpu_check.pytest_failures(log) == ["tests/cuda/test_x.py::test_a[1]", "tests/cuda/test_y.py::test_b"]
    assert gpu_check.pytest_outcome("===== 7 passed, 2 deselected in 3.01s =====") == "7 passed, 2 deselected"
    assert gpu_check.pytest_outcome("no summary") == ""


def fake_run():
    info = {"device": "Fake GPU", "capability": "9.0", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0",
            "python": "3.12.3"}
    stages = [gpu_check.Stage("environment", "passed", 1.0),
              gpu_check.Stage("cuda-suite", "failed", 200.0, "10 passed, 1 failed", ["tests/cuda/t.py::test_a"]),
              gpu_check.Stage("bench-attention", "timeout", 120.0, "stopped after its limit of 120 s")]
    bench = {"bench-rowwise": {"targets": [dict(target="ev_softmax (Triton): fast", met=False,
                                                measured=dict(worst_vs_softmax=1.3, missed_at=["float32 8x8"]))]},
             "bench-attention": {"targets": [dict(target="flash: fast", measured=1.1, met=True)]},
             "bench-train": None}
    return info, stages, bench


def test_summary_and_files_from_a_fake_run(tmp_path):
    info, stages, bench = fake_run()
    text = gpu_check.write_results(tmp_path, info, stages, bench)
    assert text == (tmp_path / "summary.md").read_text()
    assert text.startswith("# gpu-check: FAILED")
    assert "Fake GPU (compute capability 9.0); torch 2.11.0, cuda 13.0, triton 3.6.0" in text
    assert "| cuda-suite | failed | 200 | 10 passed, 1 failed |" in text
    assert "- cuda-suite: `tests/cuda/t.py::test_a`" in text
    assert "| ev_softmax (Triton): fast | worst_vs_softmax 1.30, missed_at ['float32 8x8'] | MISSED |" in text
    assert "| flash: fast | 1.10 | met |" in text
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["environment"]["device"] == "Fake GPU"
    assert [s["status"] for s in saved["stages"]] == ["passed", "failed", "timeout"]
    stages = [gpu_check.Stage("environment", "passed", 1.0), gpu_check.Stage("wheels", "skipped", 0.0)]
    assert gpu_check.summary_markdown(info, stages, {}).startswith("# gpu-check: PASSED")


def test_result_files_are_capped_and_the_summary_fits_a_screen(tmp_path):
    info, stages, bench = fake_run()
    for i in range(gpu_check.MAX_FILES - 1):
        (tmp_path / f"extra{i}.txt").write_text("x")
    with pytest.raises(RuntimeError, match="at most 8"):
        gpu_check.write_results(tmp_path, info, stages, bench)
    long = "\n".join(f"line {i}" for i in range(100)) + "\n"
    short = gpu_check.one_screen(long)
    assert short.count("\n") == gpu_check.SUMMARY_LINES + 1 and "60 more lines" in short


def test_main_orchestrates_the_stages_and_writes_the_results(monkeypatch, tmp_path, capsys):
    """With CUDA faked present: every stage skipped but the wheels one (nothing missing or a
    carried wheel), results written, exit 0; with a budget already spent, the stages time out, exit 1."""
    monkeypatch.setattr(gpu_check, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "environment", lambda env, out, limit: {"device": "Fake GPU", "torch": "x"})
    skips = [arg for name in ("failing-first", "cuda-suite", "bench-dispatch", "triton-tests", *gpu_check.BENCH_PARTS)
             for arg in ("--skip", name)]
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), *skips]) == 0
    printed = capsys.readouterr().out
    assert "# gpu-check: PASSED" in printed and "| cuda-suite | skipped |" in printed
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "summary.md"]

    monkeypatch.setattr(gpu_check.time, "monotonic", iter(range(0, 10**6, 1000)).__next__)
    assert gpu_check.main(["--out", str(tmp_path / "late"), "--budget", "1"]) == 1
    saved = json.loads((tmp_path / "late" / "gpu_check.json").read_text())
    assert {s["status"] for s in saved["stages"][1:]} == {"timeout"}


def test_a_stage_stopped_at_its_limit_takes_its_children_with_it(tmp_path):
    """(pytest-xdist workers must not outlive a timed-out CUDA suite.)"""
    marker = tmp_path / "child-alive"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('still here')"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    stage = gpu_check.run_stage("parent", [sys.executable, "-c", parent], 1, {"PATH": "/usr/bin:/bin"})
    assert stage.status == "timeout"
    import time

    time.sleep(4)
    assert not marker.exists()


def test_a_cuda_suite_that_passed_nothing_failed():
    skipped = gpu_check.Stage("cuda-suite", "passed", 3.0, "260 skipped")
    gpu_check.require_passes(skipped)
    assert skipped.status == "failed" and skipped.detail == "260 skipped; no test passed"
    ran = gpu_check.Stage("cuda-suite", "passed", 3.0, "250 passed, 10 skipped")
    gpu_check.require_passes(ran)
    assert ran.status == "passed"


def test_carried_wheels_are_installed_only_for_missing_packages(monkeypatch):
    """A package the machine lacks: its carried wheel is pip-installed (no index) into a temporary
    folder put first on PYTHONPATH; a package it has: nothing installed."""
    import os

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    monkeypatch.setattr(gpu_check, "OPTIONAL_WHEELS", {"not_a_module_here_xyz": ("entmax",), "json": ("nothing",)})
    stage = gpu_check.install_missing_wheels(env, 60)
    assert stage.status == "passed" and stage.detail == "installed entmax-1.3-py3-none-any.whl"
    target = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(target) / "entmax" / "__init__.py").is_file()
    import shutil

    shutil.rmtree(target)
    monkeypatch.setattr(gpu_check, "OPTIONAL_WHEELS", {"json": ("nothing",)})
    assert gpu_check.install_missing_wheels(dict(os.environ), 60).detail == "nothing missing"
    monkeypatch.setattr(gpu_check, "OPTIONAL_WHEELS", {"not_a_module_here_xyz": ("no_such_wheel",)})
    assert gpu_check.install_missing_wheels(dict(os.environ), 60).status == "skipped"


def test_committed_failures_come_first_and_the_rest_in_shards(monkeypatch, tmp_path):
    """failing-first runs the tests that failed in a committed run (read from results/gpu logs),
    then every other collected test in --shards stages; each stage names its tests explicitly."""
    runs = tmp_path / "results" / "gpu" / "run1"
    runs.mkdir(parents=True)
    (runs / "pytest.log").write_text("[gw0] [ 1%] PASSED tests/cuda/test_a.py::test_x[1]\n"
                                     "[gw1] [ 2%] FAILED tests/cuda/test_a.py::test_y\n"
                                     "tests/cuda/test_b.py::test_z FAILED\n")
    assert gpu_check.committed_failures(tmp_path) == ["tests/cuda/test_a.py::test_y", "tests/cuda/test_b.py::test_z"]
    suite = ["tests/cuda/test_a.py::test_x[1]", "tests/cuda/test_a.py::test_y", "tests/cuda/test_a.py::test_w",
             "tests/cuda/test_b.py::test_v"]
    assert gpu_check.shards(suite, 3) == [[suite[0], suite[3]], [suite[1]], [suite[2]]]
    assert gpu_check.shards(suite[:1], 3) == [suite[:1]]
    commands = {}
    monkeypatch.setattr(gpu_check, "committed_failures", lambda root=None: ["tests/cuda/test_a.py::test_y"])
    monkeypatch.setattr(gpu_check, "unproven_obligation_tests", lambda collected: [])
    monkeypatch.setattr(gpu_check, "collect_suite", lambda env, limit: suite)
    monkeypatch.setattr(gpu_check, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "environment", lambda env, out, limit: {"device": "Fake GPU", "torch": "x"})
    monkeypatch.setattr(gpu_check, "run_stage", lambda name, command, limit, env, log=None:
                        commands.setdefault(name, command) and gpu_check.Stage(name, "passed", 0.0, "1 passed"))
    skips = [arg for name in ("wheels", "bench-dispatch", "triton-tests", *gpu_check.BENCH_PARTS)
             for arg in ("--skip", name)]
    gpu_check.main(["--out", str(tmp_path / "out"), "--shards", "2", *skips])
    assert list(commands) == ["failing-first", "cuda-suite-1", "cuda-suite-2"]
    assert commands["failing-first"][-1:] == ["tests/cuda/test_a.py::test_y"]
    ran = commands["cuda-suite-1"] + commands["cuda-suite-2"]
    rest = sorted(set(suite) - {"tests/cuda/test_a.py::test_y"})
    assert sorted(t for t in ran if t.startswith("tests/cuda/")) == rest


def test_unproven_obligations_come_first(monkeypatch):
    """The tests of a dispatch obligation the record does not prove are picked out of the collected
    suite (so a window proves the record first); a proven one's are not."""
    from sparsenorm.kernels import cuda_proof

    monkeypatch.setattr(cuda_proof, "RECORD", {("attention", "softmax", "float32"): ("sdpa", "results/gpu/x", 1)})
    suite = ["tests/cuda/test_attention_cuda.py::test_softmax_sdpa_route_equals_dense[float32]",
             "tests/cuda/test_attention_cuda.py::test_softmax_sdpa_route_equals_dense[bfloat16]",
             "tests/cuda/test_attention_cuda.py::test_flex_backend_equals_reference_path[float16]",
             "tests/cuda/test_rowwise_cuda.py::test_against_the_entmax_package[sparsemax-7]"]
    assert gpu_check.unproven_obligation_tests(suite) == [suite[2], suite[1]]

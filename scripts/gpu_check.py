"""Prove the CUDA paths on a GPU in one command: ``make gpu-check`` (or ``python3 scripts/gpu_check.py``).

Runs from the repository root with whatever ``python3`` the machine has (torch with CUDA, triton,
pytest; no install step, no network), in stages, each under its own time limit so the whole run
ends within ``--budget`` seconds (default 9 minutes):

1. ``environment``: ``nvidia-smi`` and the versions of Python, torch, CUDA, triton, transformers;
2. ``wheels``: packages the machine lacks (``entmax`` for the peer comparisons, ``rouge_score``
   for the translation experiment) installed with
   ``pip --no-deps --no-index`` from ``scripts/gpu_wheels/`` into a temporary folder put on
   ``PYTHONPATH``, only where they are missing;
3. ``failing-first``: the CUDA-suite tests that failed in any committed run (``results/gpu/*/*.log``),
   then those of every dispatch obligation the record does not prove yet
   (``sparsenorm.kernels.cuda_proof``), alone, their tracebacks appended to the log as they happen;
4. ``cuda-suite-1`` .. ``-N``: every other test of ``pytest -m cuda tests/cuda`` (every kernel and
   CUDA dispatch against the reference path, torch.compile, CUDA graphs, Hugging Face, one training
   step per experiment) in ``--shards`` stages, each under the ``cuda-suite`` limit, so that a window
   ends with a complete pass/fail list per shard; ``scripts/gpu_record.py`` then regenerates the
   dispatch record (``sparsenorm/kernels/cuda_record.py``) from the log, here, once it is committed;
5. ``bench-dispatch``: ``python -m benchmarks.bench_gpu_dispatch`` (the plan table, ev-softmax on
   Flex causal and not, the decode path, the 16-bit entry path, one SmolLM2 training step), each
   target met or missed;
6. ``bench-rowwise``, ``bench-attention`` and ``bench-memory-loss``:
   ``python -m benchmarks.bench_gpu --only PART`` (row-wise kernels against ``torch.softmax`` and
   the measured copy bandwidth; flash ev-softmax attention against SDPA and FlexAttention, with the
   fraction of key blocks skipped; peak memory up to L = 32k; the fused vocabulary loss against the
   materialised one), each target met or missed (``--only train``, the MiniLM step too, by hand);
7. ``triton-tests``: the Triton kernel tests of the default suite, which run in-process on CUDA.

Writes into ``--out`` (default ``$OUT``, else ``gpu-check-out``) at most 8 files: ``summary.md``,
``gpu_check.json`` (environment with ``nvidia-smi``'s output, every stage's status, time and
detail), ``pytest.log``, ``bench.log``, ``bench_dispatch.json``, ``bench_rowwise.json``,
``bench_attention.json``, ``bench_memory_loss.json``; prints a one-screen summary; exits 1 if any
stage failed or ran out of time, else 0. On a machine without a CUDA device it says so in one
line and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "scripts" / "gpu_wheels"
MAX_FILES = 8  # the lent machine returns at most 8 files from $OUT
SUMMARY_LINES = 40  # what the printed summary may take: one screen

# Stage time limits in seconds (they add up to under the default budget; each is also cut to the
# budget left when it starts).
LIMITS = {"environment": 20, "wheels": 20, "failing-first": 60, "cuda-suite": 95, "bench-dispatch": 90,
          "bench-rowwise": 45, "bench-attention": 100, "bench-memory-loss": 45, "triton-tests": 45}
BENCH_PARTS = {"bench-rowwise": ("rowwise",), "bench-attention": ("attention",),
               "bench-memory-loss": ("memory", "loss")}
SHARDS = 3  # the CUDA suite in this many stages, each under the cuda-suite limit (a complete list per shard)
PER_TEST_LIMIT = 90  # seconds, pytest-timeout's --timeout where it is installed
# Modules the lent machine's image lacks, and the carried wheels that provide each (with the
# dependencies it also lacks): the entmax package (peer comparisons) and ROUGE-L (translation).
OPTIONAL_WHEELS = {"entmax": ("entmax",), "rouge_score": ("rouge_score", "nltk", "defusedxml")}


@dataclass
class Stage:
    name: str
    status: str  # "passed", "failed", "timeout", "skipped"
    seconds: float = 0.0
    detail: str = ""
    failures: List[str] = field(default_factory=list)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out",
                        help="folder for the result files (default: $OUT, else gpu-check-out)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds the whole run may take (default 480: 8 minutes)")
    parser.add_argument("--skip", action="append", default=[], choices=sorted(LIMITS),
                        help="leave a stage out (repeatable)")
    parser.add_argument("--limit", action="append", default=[], metavar="STAGE=SECONDS",
                        help="override one stage's time limit (repeatable)")
    parser.add_argument("--select", default=None, metavar="EXPR",
                        help="only the CUDA-suite tests matching this pytest -k expression (e.g. the failures of "
                             "the last window, so that their tracebacks come back first)")
    parser.add_argument("--shards", type=int, default=SHARDS,
                        help="split the CUDA suite into this many stages, each under the cuda-suite limit")
    parser.add_argument("--workers", type=int, default=4,
                        help="pytest-xdist processes for the CUDA suite where xdist is installed (0: none)")
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    if args.select is not None and not args.select.strip():
        parser.error("--select must be a non-empty pytest -k expression")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    if args.shards < 1:
        parser.error(f"--shards must be >= 1, got {args.shards}")
    args.limits = dict(LIMITS)
    for item in args.limit:
        stage, _, seconds = item.partition("=")
        if stage not in LIMITS or not seconds.replace(".", "", 1).isdigit() or float(seconds) <= 0:
            parser.error(f"--limit must be STAGE=SECONDS with STAGE one of {sorted(LIMITS)}, got {item!r}")
        args.limits[stage] = float(seconds)
    return args


def cuda_unavailable_reason() -> Optional[str]:
    """Why no CUDA check can run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def pytest_outcome(log: str) -> str:
    """pytest's closing counts, e.g. ``"212 passed, 3 failed, 4 skipped"`` (or ``""``)."""
    found = re.findall(r"=+ (.*?\d+ (?:passed|failed|error|errors|skipped|deselected).*?) in [\d.]+s", log)
    if found:
        return found[-1]
    quiet = re.findall(r"^(\d+ (?:passed|failed|error|errors|skipped).*?) in [\d.]+s", log, re.M)
    return quiet[-1] if quiet else ""


def pytest_failures(log: str, limit: int = 20) -> List[str]:
    """The test ids pytest lists as FAILED/ERROR in its short summary."""
    return list(dict.fromkeys(re.findall(r"(?:^|\] )(?:FAILED|ERROR) (tests/\S+)", log, re.M)))[:limit]


_OUTCOME = re.compile(r"(PASSED|FAILED|ERROR)\s+(tests/cuda/\S+::\S+)|(tests/cuda/\S+::\S+)\s+(PASSED|FAILED|ERROR)")


def log_outcomes(text: str):
    """``(outcome, test id)`` for every CUDA-suite test a pytest ``-v`` log names (xdist's
    ``PASSED tests/...`` and plain ``tests/... PASSED`` lines); ``scripts/gpu_record.py`` reads logs with it too."""
    for m in _OUTCOME.finditer(text):
        yield (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))


def committed_failures(root: Path = ROOT) -> List[str]:
    """The CUDA-suite tests that failed in any committed run (``results/gpu/*/*.log``), in order:
    they run first, so that a window cut short still returns their tracebacks."""
    failed: List[str] = []
    for log in sorted((root / "results" / "gpu").glob("*/*.log")):
        for outcome, test in log_outcomes(log.read_text(errors="replace")):
            if outcome != "PASSED" and test not in failed:
                failed.append(test)
    return failed


def unproven_obligation_tests(collected: Sequence[str]) -> List[str]:
    """The collected tests of every dispatch obligation the committed record does not prove yet
    (``sparsenorm.kernels.cuda_proof``): run early, so that a window proves the record first."""
    sys.path.insert(0, str(ROOT))
    try:
        from sparsenorm.kernels import cuda_proof
    except Exception:  # noqa: BLE001 -- without the library the suite itself will say why
        return []
    finally:
        sys.path.remove(str(ROOT))
    wanted: List[str] = []
    for ob in cuda_proof.OBLIGATIONS:
        for dtype in cuda_proof.DTYPES:
            if cuda_proof.proven(ob.kind, ob.name, dtype, ob.backend):
                continue
            patterns = ob.patterns(dtype)
            wanted += [t for t in collected if any(p.fullmatch(t) for p in patterns) and t not in wanted]
    return wanted


def collect_suite(env: Dict[str, str], limit: float) -> List[str]:
    """The CUDA suite's test ids as collected here (empty if collection fails)."""
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-m", "cuda", "tests/cuda"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=limit)
    except (subprocess.TimeoutExpired, OSError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def shards(tests: Sequence[str], n: int) -> List[List[str]]:
    """``tests`` dealt into ``n`` shards in turn (so that each file's slow cases spread over them)."""
    return [list(tests[i::n]) for i in range(n) if tests[i::n]]


def run_stage(name: str, command: List[str], limit: float, env: Dict[str, str], log_path: Optional[Path] = None
              ) -> Stage:
    """Run ``command`` under ``limit`` seconds, appending its output to ``log_path``."""
    start = time.monotonic()
    header = f"\n===== {name}: {' '.join(command)}\n"
    try:
        # Its own process group, so that a stage stopped at its limit takes its children with it
        # (pytest-xdist workers would otherwise hold the GPU through the next stage).
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    except OSError as err:
        output, status, detail = str(err), "failed", f"could not start: {err}"
    else:
        try:
            output, _ = proc.communicate(timeout=limit)
            status = "passed" if proc.returncode == 0 else "failed"
            detail = "" if proc.returncode == 0 else f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            status, detail = "timeout", f"stopped after its limit of {limit:.0f} s"
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(header + output)
    stage = Stage(name, status, round(time.monotonic() - start, 1), detail)
    if "pytest" in command:
        counts = pytest_outcome(output)
        stage.detail = "; ".join(x for x in (counts, stage.detail) if x)
        stage.failures = pytest_failures(output)
    elif status != "passed":
        stage.failures = output.strip().splitlines()[-3:]
    return stage


def require_passes(stage: Stage) -> None:
    """On a CUDA machine a suite that passed nothing (all skipped: a broken device fixture, say) failed."""
    if stage.status == "passed" and not re.search(r"\b[1-9]\d* passed", stage.detail):
        stage.status = "failed"
        stage.detail = "; ".join(x for x in (stage.detail, "no test passed") if x)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process of its group (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def environment(env: Dict[str, str], out: Path, limit: float) -> Dict[str, object]:
    """nvidia-smi into ``out`` and the software versions (from a subprocess: the imports load CUDA)."""
    info: Dict[str, object] = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi], capture_output=True, text=True, timeout=limit)
            info["nvidia_smi"] = done.stdout + done.stderr
        except (subprocess.TimeoutExpired, OSError) as err:
            info["nvidia_smi"] = f"nvidia-smi failed: {err}"
    code = (
        "import json, platform, torch\n"
        "info = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
        "        'device': torch.cuda.get_device_name(),\n"
        "        'capability': '.'.join(map(str, torch.cuda.get_device_capability()))}\n"
        "for name in ('triton', 'transformers', 'entmax', 'pytest', 'hypothesis'):\n"
        "    try:\n"
        "        info[name] = __import__(name).__version__\n"
        "    except Exception as e:\n"
        "        info[name] = None\n"
        "print(json.dumps(info))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=limit)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            info["error"] = f"version probe failed: {last}"
        else:
            info.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as err:
        info["error"] = f"version probe failed: {err}"
    return info


def install_missing_wheels(env: Dict[str, str], limit: float) -> Stage:
    """pip-install the carried wheels of missing optional packages into a temporary folder on PYTHONPATH."""
    start = time.monotonic()
    missing = [m for m in OPTIONAL_WHEELS if subprocess.run([sys.executable, "-c", f"import {m}"], env=env,
                                                            capture_output=True).returncode != 0]
    wheels = [w for m in missing for name in OPTIONAL_WHEELS[m] for w in sorted(WHEELS.glob(f"{name}-*.whl"))]
    if not missing:
        return Stage("wheels", "passed", 0.0, "nothing missing")
    if not wheels:
        return Stage("wheels", "skipped", 0.0, f"missing {', '.join(missing)}; no wheel in {WHEELS.relative_to(ROOT)}")
    target = tempfile.mkdtemp(prefix="gpu-check-site-")
    stage = run_stage("wheels", [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                 "--no-compile", "--target", target, *map(str, wheels)], limit, env)
    if stage.status == "passed":
        env["PYTHONPATH"] = os.pathsep.join([target, env.get("PYTHONPATH", "")])
        stage.detail = "installed " + ", ".join(w.name for w in wheels)
    stage.seconds = round(time.monotonic() - start, 1)
    return stage


def importable(module: str, env: Dict[str, str]) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True).returncode == 0


def summary_markdown(info: Dict[str, object], stages: List[Stage], bench: Dict[str, Optional[dict]]) -> str:
    """The Markdown summary: environment, one row per stage, failing tests, every benchmark target."""
    ok = all(s.status in ("passed", "skipped") for s in stages)
    lines = [f"# gpu-check: {'PASSED' if ok else 'FAILED'}", ""]
    versions = ", ".join(f"{k} {info[k]}" for k in ("torch", "cuda", "triton", "transformers", "python")
                         if info.get(k))
    device = f"{info.get('device', 'unknown device')} (compute capability {info.get('capability', '?')})"
    lines += [f"{device}; {versions}", ""]
    lines += ["| stage | status | seconds | detail |", "| --- | --- | --- | --- |"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.detail} |" for s in stages]
    failing = [(s.name, f) for s in stages for f in s.failures if s.status not in ("passed", "skipped")]
    if failing:
        lines += ["", "Failures:", ""] + [f"- {name}: `{f}`" for name, f in failing]
    targets = [t for report in bench.values() if report for t in report.get("targets", [])]
    if targets:
        lines += ["", "| target | measured | met |", "| --- | --- | --- |"]
        lines += [f"| {t['target']} | {_measured(t['measured'])} | {'met' if t['met'] else 'MISSED'} |"
                  for t in targets]
    return "\n".join(lines) + "\n"


def _measured(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
    return "-" if value is None else f"{value:.2f}"


def one_screen(markdown: str) -> str:
    lines = markdown.splitlines()
    if len(lines) <= SUMMARY_LINES:
        return markdown
    return "\n".join(lines[:SUMMARY_LINES] + [f"... ({len(lines) - SUMMARY_LINES} more lines in summary.md)"]) + "\n"


def write_results(out: Path, info: Dict[str, object], stages: List[Stage], bench: Dict[str, Optional[dict]]) -> str:
    """Write summary.md and gpu_check.json into ``out``; returns the summary."""
    text = summary_markdown(info, stages, bench)
    (out / "summary.md").write_text(text)
    (out / "gpu_check.json").write_text(json.dumps(
        {"environment": info, "stages": [asdict(s) for s in stages]}, indent=1))
    files = [p for p in out.rglob("*") if p.is_file()]
    if len(files) > MAX_FILES:
        raise RuntimeError(f"{len(files)} files in {out}; the lent machine returns at most {MAX_FILES}")
    return text


def run_suite_stages(name: str, pytest_command: List[str], args, env: Dict[str, str], limit, log: Path) -> List[Stage]:
    """``failing-first``: the tests that failed in a committed run, alone (their tracebacks are
    written as they happen); ``cuda-suite``: every other test, in ``args.shards`` stages, each under
    the cuda-suite limit, so that a window ends with a complete pass/fail list of each shard."""
    collected = collect_suite(env, 60)
    failed = [t for t in committed_failures() if t in collected]
    unproven = [t for t in unproven_obligation_tests(collected) if t not in failed]
    first = failed + unproven
    if name == "failing-first":
        if not first:
            return [Stage(name, "skipped", 0.0, "no committed failure or unproven obligation in the suite")]
        stage = run_stage(name, pytest_command + first, limit(name), env, log)
        require_passes(stage)
        stage.detail = (f"{len(failed)} tests that failed in a committed run, {len(unproven)} of unproven "
                        "dispatch obligations; " + stage.detail)
        print(f"gpu-check: {stage.name} {stage.status} ({stage.seconds:.0f} s) {stage.detail}", flush=True)
        return [stage]
    if not collected:  # collection failed: run the suite whole, and its errors show in the log
        stage = run_stage(name, pytest_command + ["tests/cuda"], limit(name), env, log)
        require_passes(stage)
        return [stage]
    rest = [t for t in collected if t not in set(first)]
    stages = []
    for i, part in enumerate(shards(rest, args.shards), 1):
        stage = run_stage(f"{name}-{i}", pytest_command + part, limit(name), env, log)
        require_passes(stage)
        stage.detail = f"shard {i}/{args.shards}, {len(part)} tests; " + stage.detail
        stages.append(stage)
        print(f"gpu-check: {stage.name} {stage.status} ({stage.seconds:.0f} s) {stage.detail}", flush=True)
    return stages


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"gpu-check: {reason}; nothing to check on this machine.")
        return 0
    deadline = time.monotonic() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)

    def limit(name: str) -> float:
        return max(1.0, min(args.limits[name], deadline - time.monotonic()))

    stages: List[Stage] = []
    start = time.monotonic()
    info = environment(env, out, limit("environment"))
    stages.append(Stage("environment", "failed" if "error" in info else "passed",
                        round(time.monotonic() - start, 1), info.get("error", "")))
    plan = ["wheels", "failing-first", "cuda-suite", "bench-dispatch", *BENCH_PARTS, "triton-tests"]
    pytest_log, bench_log = out / "pytest.log", out / "bench.log"
    env["SPARSENORM_FAILURE_LOG"] = str(pytest_log.resolve())  # tests/cuda/conftest.py: tracebacks as they happen
    workers = ["-n", str(args.workers)] if args.workers and importable("xdist", env) else []
    timeout = [f"--timeout={PER_TEST_LIMIT}"] if importable("pytest_timeout", env) else []
    commands = {
        # -v names each test as it finishes and --tb=line gives each failure's line: a suite stopped
        # at its limit still says which tests failed.
        "cuda-suite": [sys.executable, "-m", "pytest", "-v", "--tb=line", "-rfE", "-p", "no:cacheprovider",
                       "-m", "cuda", *workers, *timeout, *(["-k", args.select] if args.select else []),
                       "tests/cuda"],
        "triton-tests": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *timeout,
                         "tests/kernels/test_triton_rowwise.py", "tests/kernels/test_triton_attention.py",
                         "tests/kernels/test_triton_compile.py"],
    }
    commands["bench-dispatch"] = [sys.executable, "-m", "benchmarks.bench_gpu_dispatch", "--rounds", "5",
                                  "--json", str(out / "bench_dispatch.json")]
    for name, parts in BENCH_PARTS.items():
        commands[name] = [sys.executable, "-m", "benchmarks.bench_gpu", "--quick", "--rounds", "5",
                          *(a for p in parts for a in ("--only", p)),
                          "--json", str(out / f"{name.replace('-', '_')}.json")]
    for name in plan:
        if name in args.skip:
            stages.append(Stage(name, "skipped", 0.0, "--skip"))
        elif deadline - time.monotonic() < 5:
            stages.append(Stage(name, "timeout", 0.0, "no time left in the budget"))
        elif name == "wheels":
            stages.append(install_missing_wheels(env, limit(name)))
        elif name == "failing-first" and args.select:
            stages.append(Stage(name, "skipped", 0.0, "--select"))
        elif name in ("failing-first", "cuda-suite") and not args.select:
            stages.extend(run_suite_stages(name, commands["cuda-suite"][:-1], args, env, limit, pytest_log))
            continue
        else:
            log = bench_log if name in BENCH_PARTS else pytest_log
            stages.append(run_stage(name, commands[name], limit(name), env, log))
            if name == "cuda-suite":
                require_passes(stages[-1])
        print(f"gpu-check: {stages[-1].name} {stages[-1].status} ({stages[-1].seconds:.0f} s) {stages[-1].detail}",
              flush=True)
    bench = {}
    for name in ("bench-dispatch", *BENCH_PARTS):
        path = out / f"{name.replace('-', '_')}.json"
        try:
            bench[name] = json.loads(path.read_text()) if path.exists() else None
        except ValueError:
            bench[name] = None
    text = write_results(out, info, stages, bench)
    print(one_screen(text), end="")
    return 0 if all(s.status in ("passed", "skipped") for s in stages) else 1


if __name__ == "__main__":
    sys.exit(main())

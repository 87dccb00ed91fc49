"""benchmarks.bench's logic: options, the pass/miss judgement, the load check, the JSON it writes and
the tables regenerated from that JSON (timings themselves belong to the benchmark, never to a test)."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench

REPO = Path(__file__).resolve().parents[2]


def parse(*argv):
    return bench.parse_args(bench.build_parser(), list(argv))


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "4096by128"], "--shapes"),
    (["--shapes", "0x8"], "--shapes"),
    (["--scales", "1,-2"], "--scales"),
    (["--threads", "0"], "--threads"),
    (["--simd", "sse9"], "--simd"),
    (["--rounds", "0"], "--rounds"),
    (["--clock", "thread", "--threads", "1,2"], "--threads 1"),
    (["--normalizers", "posthoc_evidential"], "post-hoc"),
])
def test_bad_options_are_refused_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_are_the_issues_grid_and_quick_is_small():
    full = parse()
    assert full.shapes == [(4096, 128), (1024, 1024), (256, 32000), (16384, 512)]
    assert full.scales == [1.0, 2.0, 4.0] and full.threads == [1, 2] and full.clock == "wall"
    assert not full.no_compile and full.simd is None
    quick = parse("--quick", "--scales", "2")
    assert quick.shapes == bench.QUICK["shapes"] and quick.rounds == bench.QUICK["rounds"]
    assert quick.scales == [2.0] and quick.no_compile  # an explicit option wins over --quick's
    assert parse("--clock", "thread").threads == [1]


def test_child_argv_repeats_the_settings_but_simd():
    args = parse("--shapes", "8x4,16x2", "--scales", "1,2.5", "--threads", "2", "--rounds", "2",
                 "--normalizers", "sparsemax", "--no-compile", "--simd", "avx2")
    child = parse(*bench.child_argv(args, "out.json"))
    for key in ("shapes", "scales", "threads", "rounds", "normalizers", "no_compile", "clock", "device"):
        assert getattr(child, key) == getattr(args, key), key
    assert child.simd is None and child.json == "out.json" and child.parent_judged_loadavg


def test_every_target_names_a_row_the_benchmark_times():
    candidates, _ = bench.build_candidates(bench.default_names(), compile_rows=False)
    labels = {c.label for c in candidates}
    assert set(bench.TARGETS) <= labels
    assert bench.BEAT_ENTMAX_PACKAGE <= set(bench.TARGETS)


def test_judge_pass_and_miss():
    assert bench.judge("sparsemax", 1.5, None) is True  # the target is inclusive
    assert bench.judge("sparsemax", 1.51, None) is False
    assert bench.judge("sparsemax [reference]", 1.0, None) is None  # only the default path is judged
    assert bench.judge("entmax_bisect", 3.0, 0.9) is True
    assert bench.judge("entmax_bisect", 3.0, 1.0) is False  # must be faster than the entmax package
    assert bench.judge("entmax_bisect", 5.0, 0.5) is False
    assert bench.judge("entmax_bisect", 3.0, None) is True  # package not installed: the ratio alone


def test_load_check():
    assert bench.busy_fraction((100, 1000), (150, 1100)) == pytest.approx(0.5)
    assert bench.busy_fraction((100, 1000), (100, 1000)) is None
    idle = {"busy_fraction": 0.02, "loadavg_1min": 0.1, "cpu_count": 2, "window_s": 1.0}
    assert not bench.is_loaded(idle, judge_loadavg=True)
    assert bench.is_loaded(dict(idle, busy_fraction=0.5), judge_loadavg=False)
    assert bench.is_loaded(dict(idle, loadavg_1min=1.5), judge_loadavg=True)
    assert not bench.is_loaded(dict(idle, loadavg_1min=1.5), judge_loadavg=False)  # this process's own load
    assert "WARNING" in bench.load_warning(dict(idle, busy_fraction=0.5))


def _row(function, ratio, ms, vs_entmax=None, baseline="torch.softmax"):
    return {"function": function, "baseline": baseline, "fwd_ms": ms / 2, "fwdbwd_ms": ms, "fwd_vs_softmax": ratio,
            "fwdbwd_vs_softmax": ratio, "fwdbwd_vs_entmax_best": vs_entmax, "target": bench.TARGETS.get(function),
            "passed": bench.judge(function, ratio, vs_entmax)}


def _run(threads, shape, ratio, loaded=False):
    load = {"busy_fraction": 0.5 if loaded else 0.0, "loadavg_1min": 0.0, "cpu_count": 2, "window_s": 0.5,
            "loaded": loaded}
    return {"simd": "AVX512", "threads": threads, "scale": 1.0, "shape": shape, "load": load,
            "rows": [_row("torch.softmax", 1.0, 2.0 / threads), _row("sparsemax", ratio, 4.0 / threads),
                     _row("entmax_bisect", 3.0, 6.0, vs_entmax=0.5)]}


def test_report_tables_from_a_document():
    args = parse("--shapes", "8x4,16x4", "--scales", "1", "--threads", "1,2")
    document = bench.new_document(args)
    document["load_at_start"] = {"loaded": False}
    document["runs"] = [_run(1, "8x4", 1.2), _run(1, "16x4", 1.8), _run(2, "8x4", 1.2, loaded=True),
                        _run(2, "16x4", 1.2)]
    report = bench.markdown_report(json.loads(json.dumps(document)))  # as read back from the file
    lines = report.splitlines()
    assert "| sparsemax | 1.20x | 1.80x | <= 1.5x vs torch.softmax | miss (1 of 2) |" in lines
    assert "| sparsemax | 1.20x | 1.20x | <= 1.5x vs torch.softmax | pass |" in lines
    assert any(line.startswith("| entmax_bisect | 3.00x (0.50x the entmax package) |") and line.endswith("| pass |")
               for line in lines)
    assert "| torch.softmax | 2.00x | 2.00x |" in lines  # thread scaling: 1-thread time over 2-thread time
    assert "| entmax_bisect | 1.00x | 1.00x |" in lines
    assert "Measured on a loaded machine" in report and "1 of 4 timings" in report and "at the start" not in report


def test_quick_run_writes_the_json_and_report_regenerates_its_tables(tmp_path, capsys):
    path = tmp_path / "results" / "cpu.json"
    assert bench.main(["--quick", "--shapes", "16x8", "--rounds", "1", "--normalizers", "sparsemax,entmax_bisect",
                       "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(path.read_text())
    assert document["schema"] == bench.SCHEMA and document["targets"] == bench.TARGETS
    assert {"cpu_model", "cpu_count", "torch"} <= set(document["machine"])
    assert {"busy_fraction", "loadavg_1min", "loaded"} <= set(document["load_at_start"])
    (run,) = document["runs"]
    assert run["simd"] == torch.backends.cpu.get_cpu_capability() and f"SIMD level {run['simd']}" in printed
    assert (run["threads"], run["scale"], run["shape"]) == (1, 1.0, "16x8")
    rows = {row["function"]: row for row in run["rows"]}
    assert rows["sparsemax"]["target"] == bench.TARGETS["sparsemax"]
    assert rows["sparsemax"]["passed"] == (rows["sparsemax"]["fwdbwd_vs_softmax"] <= bench.TARGETS["sparsemax"])
    assert rows["torch.softmax"]["fwdbwd_vs_softmax"] == 1.0 and rows["torch.softmax"]["passed"] is None
    assert bench.main(["--report", str(path)]) == 0
    assert capsys.readouterr().out.strip() == bench.markdown_report(document).strip()


@pytest.mark.slow
def test_simd_runs_each_level_in_its_own_process(tmp_path):
    level = bench.best_simd_level()  # this CPU's (its kernels are built already); the merge is the same for two
    path = tmp_path / "simd.json"
    assert bench.main(["--quick", "--shapes", "16x8", "--rounds", "1", "--normalizers", "sparsemax",
                       "--simd", level, "--json", str(path)]) == 0
    document = json.loads(path.read_text())
    assert [run["simd"].lower() for run in document["runs"]] == [level]
    assert isinstance(document["load_at_start"], list) and len(document["load_at_start"]) == 2  # the whole, the level


def test_docs_page_renders_the_normalizer_json(tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("sparsenorm_docs_hooks_bench", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    document = bench.new_document(parse("--shapes", "8x4", "--scales", "1", "--threads", "1"))
    document["load_at_start"] = {"loaded": False}
    document["runs"] = [_run(1, "8x4", 1.2)]
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "cpu_normalizers.json").write_text(json.dumps(document))
    monkeypatch.setattr(hooks, "REPO_ROOT", tmp_path)
    page, figures = hooks.benchmark_results_page()
    assert "## `cpu_normalizers.json`" in page and bench.markdown_report(document) in page and not figures

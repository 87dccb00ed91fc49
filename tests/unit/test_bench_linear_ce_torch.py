"""benchmarks.bench_linear_ce_torch's plumbing (timings belong to the benchmark, never to a test): a tiny
run writes its JSON with the load it ran under, and the verdicts follow issue 50's targets."""
import json

from benchmarks import bench_linear_ce_torch as bench


def test_tiny_run_writes_the_json_and_the_report(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench.main(["--tokens", "16", "--dim", "8", "--vocab", "64", "--rounds", "1", "--threads", "1",
                "--losses", "softmax,entmax15", "--no-memory", "--json", str(out)])
    results = json.loads(out.read_text())
    assert results["schema"] == bench.SCHEMA
    assert set(results["time_s"]) == set(bench.labels_for(["softmax", "entmax15"]))
    assert "load_at_start" in results and "uptime_at_start" in results and "loaded" in results
    capsys.readouterr()
    bench.main(["--report", str(out)])
    assert "| sparsenorm entmax15 |" in capsys.readouterr().out


def test_verdicts_follow_the_targets():
    results = {"tokens": 1, "dim": 1, "vocab": 1, "threads": 1, "rounds": 1, "cpu": "x",
               "losses": ["softmax", "ev_softmax", "sparsemax"],
               "time_s": {bench.BASELINE: 1.0, "sparsenorm softmax": 1.01, "sparsenorm ev_softmax": 1.1,
                          "sparsenorm sparsemax": 1.6},
               "peak_bytes": {bench.BASELINE: 100, "sparsenorm softmax": 100}}
    v = bench.verdicts(results)
    assert v["sparsenorm softmax"] == {"time": "missed", "memory": "met"}
    assert v["sparsenorm ev_softmax"] == {"time": "met"}
    assert v["sparsenorm sparsemax"] == {"time": "missed"}
    assert "time missed, memory met" in bench.markdown_report(results)

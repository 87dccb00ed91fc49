"""benchmarks.bench_linear_loss's plumbing on a tiny shape: the JSON it writes, the report regenerated from
it and the verdicts against the targets (timings themselves belong to the benchmark, never to a test)."""
import json

from benchmarks import bench_linear_loss


def test_tiny_run_writes_the_json_and_the_report(tmp_path, capsys):
    out = tmp_path / "r.json"
    bench_linear_loss.main(["--tokens", "16", "--dim", "8", "--vocab", "64", "--rounds", "1", "--threads", "1",
                            "--losses", "ev_softmax,entmax15", "--no-memory", "--json", str(out)])
    results = json.loads(out.read_text())
    assert results["schema"] == bench_linear_loss.SCHEMA
    labels = bench_linear_loss.labels_for(["softmax", "ev_softmax", "entmax15"])
    assert set(results["time_s"]) == set(labels)
    # the memory figure of one candidate, in this process (the benchmark runs each in a fresh one)
    assert bench_linear_loss.loss_peak_here(bench_linear_loss.loss_fn("fused entmax15"), 16, 8, 64, 1.0, 1) >= 0
    results["peak_bytes"] = {label: 1000 for label in labels}
    out.write_text(json.dumps(results))
    capsys.readouterr()
    bench_linear_loss.main(["--report", str(out)])
    table = capsys.readouterr().out
    assert "| fused entmax15 |" in table and "memory met" not in table and "memory missed" in table


def test_verdicts_follow_the_targets():
    results = {"tokens": 1, "dim": 1, "vocab": 1, "logit_scale": 1.0, "threads": 1, "rounds": 1, "cpu": "x",
               "losses": ["softmax", "sparsemax"],
               "time_s": {"materialised softmax": 1.0, "fused softmax": 1.3, "fused sparsemax": 1.4},
               "peak_bytes": {"materialised softmax": 100, "fused softmax": 5, "fused sparsemax": 11}}
    table = bench_linear_loss.markdown_report(results)
    assert "| fused softmax | 1.30 | 1.30 | 0 | 0.050 | 1.2 / 0.1 | time missed, memory met |" in table
    assert "time met, memory missed" in table

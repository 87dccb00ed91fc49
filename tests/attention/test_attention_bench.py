"""bench_attention runs end to end on tiny sizes (timings themselves belong to the benchmark)."""
import sys
from unittest import mock

import pytest
import torch

from benchmarks import bench_attention
from sparsenorm.kernels import disabled


def test_tables_for_every_candidate(capsys):
    assert bench_attention.main(["--lengths", "32", "--rounds", "1", "--no-memory", "--batch-heads", "2",
                                 "--dim", "8"]) == 0
    out = capsys.readouterr().out
    for label in bench_attention.CANDIDATES:
        assert (f"| {label} |" in out) == (label not in bench_attention.RECOMPUTED)  # those on request only
    assert "## L = 32" in out


def test_dense_limit_skips_large_dense_candidates():
    assert bench_attention.dense_fits("ev_softmax (blockwise)", 8, 10**6, 0.001)
    assert not bench_attention.dense_fits("sparsemax (dense)", 8, 16384, 16.0)
    assert bench_attention.dense_fits(bench_attention.FUSED, 8, 16384, 16.0)  # its flash kernel: O(L) memory


def test_fused_candidate_runs_sdpa_flash_kernel_forward_and_backward():
    """The candidate named SDPA's default CPU kernel runs its flash kernel, not the math backend (which
    SDPA silently takes for 3-D inputs, as this benchmark's were)."""
    q, k, v, grad = bench_attention.make_inputs(2, 64, 8)
    with torch.profiler.profile() as prof:
        bench_attention.run_once(bench_attention.attention_fn(bench_attention.FUSED), q, k, v, grad)
    ran = {event.key for event in prof.key_averages()}
    assert {"aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward"} <= ran, sorted(ran)
    assert "aten::_scaled_dot_product_attention_math" not in ran
    assert q.grad is not None and q.grad.shape == q.shape


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory reads /proc (Linux only)")
def test_peak_memory_of_one_forward_backward_is_measured():
    # In a fresh process, as the benchmark does: inside this long-lived test process, blocks freed by
    # earlier tests are reused without raising the resident size, so a peak measured here can fall
    # short of the allocation (it did, once other tests ran first).
    peak = bench_attention.measure_peak("sdpa (math)", 2, 512, 16)
    assert peak is not None and peak >= 2 * 512 * 512 * 4  # at least the score matrix


def test_report_of_a_saved_json_repeats_the_printed_tables(tmp_path, capsys):
    """--json then --report FILE: the same tables (the docs' benchmark page renders saved files this way)."""
    path = tmp_path / "attention.json"
    assert bench_attention.main(["--lengths", "32", "--rounds", "1", "--no-memory", "--batch-heads", "2",
                                 "--dim", "8", "--candidates", "sdpa (math),ev_softmax (blockwise)",
                                 "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert bench_attention.main(["--report", str(path)]) == 0
    report = capsys.readouterr().out
    table = printed[printed.index("| candidate"):].strip()
    assert table and table in report


def test_forward_only_times_the_forward_and_says_so(capsys):
    assert bench_attention.main(["--lengths", "32", "--rounds", "1", "--no-memory", "--batch-heads", "2",
                                 "--dim", "8", "--forward-only", "--candidates",
                                 f"{bench_attention.FUSED},ev_softmax (blockwise),{bench_attention.EV_REFERENCE}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# sparse_attention vs SDPA: forward, float32")
    assert f"| {bench_attention.EV_REFERENCE} |" in out and "x sdpa (default CPU kernel)" in out


def test_recomputed_candidates_recompute_and_equal_the_kept_path_to_the_bit():
    """The '(blockwise recomputed)' candidates make one score product per tile and pass (more than
    the kept path's one per tile), with the same outputs and gradients to the bit (both searching)."""
    from sparsenorm.kernels.reference import projection_attention as attention_projection

    q, k, v, grad = bench_attention.make_inputs(2, 40, 8)
    results, products = {}, {}
    score_tile = attention_projection._Grouped.scores
    for label in ("sparsemax (blockwise)", "sparsemax (blockwise recomputed)"):
        calls = []

        def counted(self, *args):
            calls.append(args[1:])
            return score_tile(self, *args)

        # the reference's search on both (on CPU the C++ row solver would solve the kept blocks)
        with mock.patch.object(attention_projection._Grouped, "scores", counted), disabled():
            bench_attention.run_once(bench_attention.attention_fn(label), q, k, v, grad)
        results[label] = [t.grad.clone() for t in (q, k, v)]
        products[label] = len(calls)
    assert all(torch.equal(a, b) for a, b in zip(*results.values()))
    assert products["sparsemax (blockwise recomputed)"] > products["sparsemax (blockwise)"] == 2


def test_pass_counts_of_the_searched_path():
    """benchmarks.attention_passes: one score product per tile with kept scores; max + >= 1 search
    step + output with recomputed ones; every row done within its block's steps."""
    from benchmarks import attention_passes

    for kind in ("sparsemax", "entmax15"):
        kept = attention_passes.count(kind, 512, 8, recomputed=False)  # equal query blocks
        recomputed = attention_passes.count(kind, 512, 8, recomputed=True)
        assert kept[2:4] == ["1.00", "1.00"]
        assert float(recomputed[2]) == 2 + float(recomputed[4]) and recomputed[3] == "2.00"
        assert kept[4:] == recomputed[4:]  # the same search either way
        assert int(kept[5].split("(")[1].rstrip(")")) <= float(kept[4]) * 2  # slowest row <= its blocks' steps

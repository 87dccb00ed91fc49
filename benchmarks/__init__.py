"""sparsenorm's benchmarks, kept outside the library (nothing here ships in the wheel).

Run from the repository root: ``python -m benchmarks.bench`` (normalizers),
``python -m benchmarks.bench_attention`` (attention) and ``python -m benchmarks.bench_gpu`` (the
Triton kernels, CUDA only). ``make bench`` runs the first two. benchmarks/README.md has the method
and the latest tables.
"""

# The two commands a newcomer needs: `make reproduce` (the main job) and `make test`.
.PHONY: reproduce reproduce-full test test-rounding test-slow test-simd test-wheel test-cuda-on-cpu bench docs venv gpu-check

venv:
	bash scripts/bootstrap.sh

reproduce: venv
	.venv/bin/sparsenorm demo
	.venv/bin/sparsenorm reproduce all --quick --out out

# Full modes. Resumable: every finished job is cached in out-full/<experiment>/runs/, so running it
# again continues where it stopped. cvae and multilabel take hours on 2 CPU cores; all of them take
# days (see the table in docs/experiments/index.md), so pick: `make reproduce-full FULL="cvae multilabel"`.
FULL ?= all
reproduce-full: venv
	for experiment in $(FULL); do .venv/bin/sparsenorm reproduce $$experiment --out out-full || exit 1; done

test: venv
	.venv/bin/python -m pytest -q -n 2 -p no:randomly

# The default suite once more as another machine would run it (CI's second leg): other rounding
# (one thread, MKL and ATen at AVX2, the C++ kernels built for AVX2 first), tests in random order
# (pytest-randomly; its seed is printed), and the perturbation mode (tests/nudge.py: the reference
# path's scores and row means moved by 1-2 ulp). Both seeds are on the command line make echoes: a
# failure reproduces with `make test-rounding NUDGE_SALT=... ORDER_SEED=...`.
NUDGE_SALT ?= $(shell date +%s)
ORDER_SEED ?= $(shell date +%N)
ROUNDING_ENV = OMP_NUM_THREADS=1 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2
test-rounding: venv
	$(ROUNDING_ENV) .venv/bin/python -c "import sparsenorm.kernels as k; k.build()" || true
	$(ROUNDING_ENV) SPARSENORM_TEST_NUDGE=$(NUDGE_SALT) .venv/bin/python -m pytest -q -n 2 -p randomly --randomly-seed=$(ORDER_SEED)

# The slow tests, then the fuzz suite with its large, randomized budget (tests/fuzz/fuzz_inputs.py).
test-slow: venv
	.venv/bin/python -m pytest -q -m slow
	SPARSENORM_FUZZ_PROFILE=fuzz-slow .venv/bin/python -m pytest -q tests/fuzz

# The CUDA suite's test bodies on this CPU (Triton kernels under its interpreter, the cases short
# enough for it; tests/cuda/conftest.py), so that they keep running between GPU windows.
test-cuda-on-cpu: venv
	SPARSENORM_CUDA_SUITE_DEVICE=cpu TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -n 2 -p no:randomly -m cuda tests/cuda

# The kernel and accuracy tests at every SIMD level this CPU runs (DEFAULT, AVX2, AVX512), each
# level's kernels built for it; a level whose kernels do not build fails.
test-simd: venv
	bash scripts/simd_matrix.sh

# A pip user's path: sdist + wheel, twine check, the bare wheel in a fresh venv (torch==2.13.0).
test-wheel: venv
	bash scripts/wheel_check.sh

# Normalizers (ratios to softmax and to the entmax package, each targeted row judged pass/miss; wall
# clock, logit scales 1,2,4, 1 and 2 threads, at every SIMD level from AVX2 up to this CPU's, each in
# its own process), into BENCH_JSON; then attention (ratios to SDPA, peak memory). Run on idle cores:
# it warns when the machine is loaded. The docs' benchmark page is rendered from the committed JSON
# (`python -m benchmarks.bench --report FILE` prints the same tables). BENCH_SIMD=avx512 for one level.
# The benchmarks live in benchmarks/ (outside the library; benchmarks/README.md has the method and tables).
BENCH_SIMD ?= all
BENCH_JSON ?= benchmarks/results/cpu_normalizers.json
bench: venv
	.venv/bin/python -m benchmarks.bench --simd $(BENCH_SIMD) --json $(BENCH_JSON)
	.venv/bin/python -m benchmarks.bench_attention

# The documentation site into site/ (open site/index.html): strict, so a broken link, a page missing
# from the navigation or an object mkdocstrings cannot find fails the build. tests/unit/test_docs.py runs it too.
# It installs only what the docs need (torch, the library, the docs extra: scripts/bootstrap.sh docs), no kernel build.
docs:
	bash scripts/bootstrap.sh docs
	NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict

# On a CUDA machine, with its own Python (no venv, no network): the CUDA suite, the Triton tests and
# `benchmarks.bench_gpu --quick`, results into $OUT (else gpu-check-out/). docs/guide/kernels.md ("GPU") says more.
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) scripts/gpu_check.py

# The two commands a newcomer needs: `make reproduce` (the main job) and `make test`.
.PHONY: reproduce reproduce-full test test-slow bench venv

venv:
	bash scripts/bootstrap.sh

reproduce: venv
	.venv/bin/sparsenorm demo
	.venv/bin/sparsenorm reproduce all --quick --out out

# Full modes. Resumable: every finished job is cached in out-full/<experiment>/runs/, so running it
# again continues where it stopped. cvae and multilabel take hours on 2 CPU cores; all of them take
# days (see the README's table), so pick: `make reproduce-full FULL="cvae multilabel"`.
FULL ?= all
reproduce-full: venv
	for experiment in $(FULL); do .venv/bin/sparsenorm reproduce $$experiment --out out-full || exit 1; done

test: venv
	.venv/bin/python -m pytest -q -n 2

# The slow tests, then the fuzz suite with its large, randomized budget (tests/fuzz/fuzz_inputs.py).
test-slow: venv
	.venv/bin/python -m pytest -q -m slow
	SPARSENORM_FUZZ_PROFILE=fuzz-slow .venv/bin/python -m pytest -q tests/fuzz

# Normalizers (ratios to softmax and to the entmax package), then attention (ratios to SDPA, peak memory).
bench: venv
	.venv/bin/python -m sparsenorm.bench
	.venv/bin/python -m sparsenorm.bench_attention

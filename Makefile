# The two commands a newcomer needs: `make reproduce` (the main job) and `make test`.
.PHONY: reproduce reproduce-full test test-slow bench venv

venv:
	bash scripts/bootstrap.sh

reproduce: venv
	.venv/bin/sparsenorm demo
	.venv/bin/sparsenorm reproduce all --quick --out out

# Hours on 2 cores; resumable: every finished (setting, seed) job is cached in out-full/<experiment>/runs/,
# so running it again continues where it stopped.
reproduce-full: venv
	.venv/bin/sparsenorm reproduce all --out out-full

test: venv
	.venv/bin/python -m pytest -q -n 2

test-slow: venv
	.venv/bin/python -m pytest -q -m slow

# Normalizers (ratios to softmax and to the entmax package), then attention (ratios to SDPA, peak memory).
bench: venv
	.venv/bin/python -m sparsenorm.bench
	.venv/bin/python -m sparsenorm.bench_attention

#!/usr/bin/env bash
# The CPU-capability matrix (issue 25): for every SIMD level this CPU runs (DEFAULT, AVX2, AVX512),
# build the C++ kernels at that level and run the kernel and accuracy tests there.
# ATEN_CPU_CAPABILITY makes torch (and so sparsenorm's build, whose cache name carries the level)
# dispatch to that level. A level whose kernels do not build fails the matrix: the tests must not
# quietly run the reference path in their place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TESTS=(tests/kernels/test_cpu_kernels.py tests/kernels/test_rsoftmax_kernel.py tests/kernels/test_hourglass_kernel.py
       tests/kernels/test_cpp_autograd.py tests/unit/test_sparsemax.py
       tests/unit/test_accuracy.py)
# pytest-xdist workers where there are cores to spare (the CI machine); one process otherwise
WORKERS=${SIMD_MATRIX_WORKERS:-2}

best=$(env -u ATEN_CPU_CAPABILITY "$PY" -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
case "$best" in
    AVX512*) levels="default avx2 avx512" ;;
    AVX2) levels="default avx2" ;;
    *) levels="default" ;;
esac
echo "simd matrix: this CPU's best level is $best; running: $levels"

summary=""
for level in $levels; do
    start=$(date +%s)
    echo "=== SIMD level $level: building the kernels"
    ATEN_CPU_CAPABILITY=$level "$PY" - "$level" <<'PY'
import sys

import torch

import sparsenorm.kernels as kernels

level = sys.argv[1]
got = torch.backends.cpu.get_cpu_capability()
assert got.lower().startswith(level), f"asked for SIMD level {level}, torch runs at {got}"
failed = {name: reason for name, reason in kernels.build().items() if reason is not None}
if failed:
    sys.exit(f"simd matrix: at {level} these kernels did not build: {failed}")
assert all(kernels.available().values()), kernels.available()
print(f"kernels built at {got}: {', '.join(kernels.available())}")
PY
    built=$(date +%s)
    echo "=== SIMD level $level: kernel and accuracy tests"
    xdist=()
    if [ "$WORKERS" -gt 1 ]; then xdist=(-n "$WORKERS"); else xdist=(-p no:xdist); fi
    # -rs lists skips; a kernel test that skips here means its kernel was not used: fail on it
    out=$(mktemp)
    set +e
    ATEN_CPU_CAPABILITY=$level "$PY" -m pytest -q -rs "${xdist[@]}" "${TESTS[@]}" 2>&1 | tee "$out"
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then echo "simd matrix: tests failed at $level"; exit "$status"; fi
    if grep -q "^SKIPPED" "$out"; then echo "simd matrix: tests skipped at $level (see above)"; exit 1; fi
    rm -f "$out"
    done_at=$(date +%s)
    summary+="$level: build $((built - start)) s, tests $((done_at - built)) s"$'\n'
done
echo "=== simd matrix passed"
printf "%s" "$summary"

#!/usr/bin/env bash
# A pip user's path (issue 25 item 2), from the built wheel in a fresh virtual environment:
# sdist + wheel pass `twine check`; with torch and the wheel alone (no extras) the library, every
# normalizer/loss/attention path, `sparsenorm --help` and `demo` work; an experiment exits with one
# line naming its extra; no benchmark file is in the wheel; without ninja or a compiler the reference path runs (one warning each);
# with the `fast` extra `sparsenorm build-kernels` builds the kernels and they are used.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$repo/.venv/bin/python}        # the development venv: has `build` and `twine` (test extra)
BASE=${PYTHON:-python3}                 # the interpreter the fresh venv is made from
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TORCH_EXTENSIONS_DIR=$work/extensions  # a private kernel cache: nothing built before counts

echo "=== build the sdist and the wheel, twine check"
"$PY" -m build --sdist --wheel --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# No deprecation warning from the build backend (setuptools' license-table deprecation had a 2027-02-18 deadline).
if grep -i "deprecat" "$work/build.log"; then
    echo "wheel check: the build warns of a deprecation (above); fix pyproject.toml before it stops building"; exit 1
fi
echo "ok: the build emits no deprecation warning"
"$PY" -m twine check --strict "$work/dist"/*
wheel=$(ls "$work/dist"/*.whl)
# The benchmarks live in benchmarks/ at the repository root: nothing benchmark-related is in the wheel.
if "$PY" -m zipfile -l "$wheel" | grep -i "bench"; then
    echo "wheel check: the wheel contains benchmark files (above); they belong in benchmarks/ only"; exit 1
fi
echo "ok: no benchmark module in the wheel"

echo "=== a fresh venv: torch==2.13.0 (the local CPU wheel), then the wheel with no extras"
"$BASE" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install --quiet)
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "$wheel"
"$work/venv/bin/python" -c "import torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
bin=$work/venv/bin
cd "$work"  # away from the source tree, so the installed package is the one imported

echo "=== the library without extras"
# Without the kernels the reference path runs after one warning naming `sparsenorm build-kernels` (the README's promise).
not_built=$("$bin/python" -W always -c "import torch, sparsenorm; x = torch.randn(3, 8); sparsenorm.ev_softmax(x); sparsenorm.sparsemax(x); sparsenorm.ev_softmax(x)" 2>&1 | grep -c "sparsenorm build-kernels" || true)
[ "$not_built" -eq 1 ] || { echo "wheel check: without built kernels, expected one warning naming build-kernels, saw $not_built"; exit 1; }
echo "ok: one warning naming sparsenorm build-kernels"
"$bin/python" "$repo/scripts/pip_user_smoke.py"
"$bin/sparsenorm" --help >/dev/null
"$bin/sparsenorm" demo >/dev/null

one_line_error() {  # $1: the text the one line must contain; the rest: the command
    local want=$1 err status
    shift
    set +e
    err=$("$@" 2>&1 >/dev/null)
    status=$?
    set -e
    if [ "$status" -eq 0 ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [[ "$err" != *"$want"* ]]; then
        echo "wheel check: \`${*}\` should exit non-zero with one line containing \"$want\"; got status $status:"
        printf '%s\n' "$err"
        exit 1
    fi
    echo "ok: $* -> $err"
}
for experiment in cvae multilabel ssvae vqvae all; do
    one_line_error "pip install 'sparsenorm[experiments]'" "$bin/sparsenorm" reproduce "$experiment" --quick
done
one_line_error "pip install 'sparsenorm[experiments,mt]'" "$bin/sparsenorm" reproduce mt --quick
one_line_error "pip install 'sparsenorm[experiments,hf]'" "$bin/sparsenorm" reproduce finetune --quick

echo "=== kernels: without ninja (no extras), without a compiler, then built with the fast extra"
# A machine may have ninja on its PATH (e.g. Debian's ninja-build): hide it behind one that fails, as
# on a machine without it; after the fast extra the venv's own ninja comes first.
mkdir -p "$work/no-ninja"
printf '#!/bin/sh\nexit 127\n' >"$work/no-ninja/ninja"
chmod +x "$work/no-ninja/ninja"
system_path=$PATH
export PATH="$work/no-ninja:$system_path"
set +e
out=$("$bin/sparsenorm" build-kernels 2>"$work/build-kernels.err")
status=$?
set -e
if [ "$status" -ne 1 ] || [[ "$out" != *"CPU kernels built: none"* ]] || ! grep -q "ninja" "$work/build-kernels.err"; then
    echo "wheel check: build-kernels without ninja should exit 1 saying why; got status $status:"
    echo "$out"; cat "$work/build-kernels.err"; exit 1
fi
echo "ok: build-kernels without ninja -> $out"
warnings_seen() {  # runs ev_softmax twice with SPARSENORM_CPU_KERNELS=1; prints the RuntimeWarnings
    SPARSENORM_CPU_KERNELS=1 "$@" "$bin/python" -W always - <<'PY' 2>&1 | grep -c RuntimeWarning || true
import torch, sparsenorm
x = torch.randn(3, 8)
with sparsenorm.kernels.disabled():
    expected = sparsenorm.ev_softmax(x)
assert torch.equal(sparsenorm.ev_softmax(x), expected) and torch.equal(sparsenorm.ev_softmax(x), expected)
PY
}
count=$(warnings_seen env)
[ "$count" -eq 1 ] || { echo "wheel check: without ninja, expected one warning, saw $count"; exit 1; }
"${pip[@]}" "$wheel[fast]"
export PATH="$bin:$system_path"
count=$(warnings_seen env CXX=/bin/false)
[ "$count" -eq 1 ] || { echo "wheel check: without a compiler, expected one warning, saw $count"; exit 1; }
"$bin/sparsenorm" build-kernels
"$bin/python" - <<'PY'
import sparsenorm.kernels as kernels
assert all(kernels.available().values()), kernels.available()
print("kernels in use after build-kernels:", ", ".join(kernels.available()))
PY
echo "=== wheel check passed"

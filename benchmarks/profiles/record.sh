#!/bin/bash
# Profile one normalizer call loop (benchmarks/profiles/drive.py) with perf, sampling the timed
# loop only (cpu-clock: this VM exposes no hardware counters), and print the top of the report.
#   benchmarks/profiles/record.sh OUT.txt [ATEN_CPU_CAPABILITY] -- DRIVE_ARGS...
# e.g. benchmarks/profiles/record.sh benchmarks/profiles/entmax15_4096x128_fwd_avx2.txt avx2 -- entmax15 4096 128 --mode fwd
set -euo pipefail
out=$1; level=$2; shift 3
work=$(mktemp -d)
mkfifo "$work/ctl" "$work/ack"
export PERF_CTL_FIFO=$work/ctl PERF_ACK_FIFO=$work/ack
ATEN_CPU_CAPABILITY=$level perf record -q -e cpu-clock -D -1 --control "fifo:$work/ctl,$work/ack" \
  -o "$work/perf.data" -- .venv/bin/python -m benchmarks.profiles.drive "$@" > "$work/timing.txt"
{
  echo "# ATEN_CPU_CAPABILITY=$level python -m benchmarks.profiles.drive $*"
  echo "# $(cat "$work/timing.txt")"
  echo "# perf record -e cpu-clock (timed loop only); perf report --stdio --no-children --sort dso,sym"
  perf report -i "$work/perf.data" --stdio --no-children --sort dso,sym 2>/dev/null \
    | grep -E '^ +[0-9]' | sed -E 's/ +$//' | cut -c1-160 | head -40 || true
} > "$out"
rm -rf "$work"
head -"${HEAD:-14}" "$out"

#!/bin/bash
# Issue 49 item 3: ten seeds in decisive mode (seeds 0-5 reused from the committed records, which the current code
# reproduces bit for bit apart from timings: /work/runs/bitcheck/<exp>.json; seeds 6-9 trained now).
# Resumable: every finished job is cached in /work/runs/decisive10/<exp>/runs/; rerunning this script skips them.
# Usage: nice -n 19 /work/runs/decisive10/run.sh EXP...   (EXP in ssvae multilabel vqvae mt)
# FRESH="vqvae": no reuse of the committed records for those experiments (not reproduced bit for bit).
cd /work/runs/code; export PYTHONPATH=/work/runs/code  # the code frozen at the commit the session began with (git worktree)
for exp in "$@"; do
  echo "=== $exp start $(date -u +%FT%TZ)"
  keys=$(/work/main/.venv/bin/python -c "
from sparsenorm.experiments._shared.paper_index import read_results
from pathlib import Path
p = read_results(Path('results/decisive/$exp/results.json.gz'))
print(' '.join(p['results']['jobs']['jobs']))")
  case " ${FRESH:-} " in *" $exp "*) echo "no reuse for $exp: all ten seeds run now";;
    *) /work/main/.venv/bin/python -m sparsenorm.experiments.committed reuse results/decisive/$exp /work/runs/decisive10 $keys;; esac
  extra=""
  case $exp in ssvae) extra="--workers 2";; multilabel) extra="--workers 2";; mt) extra="--resume";; esac
  # (mt: --resume continues an interrupted training from OUT/mt/checkpoints/, exactly as if it had not stopped)
  OMP_NUM_THREADS=1 /work/main/.venv/bin/sparsenorm reproduce $exp --decisive --seeds 10 --device cpu --out /work/runs/decisive10 $extra 2>&1 \
    | tr '\r' '\n' | grep -v "it/s\]\|s/it\]" 
  echo "=== $exp end rc=${PIPESTATUS[0]} $(date -u +%FT%TZ)"
done

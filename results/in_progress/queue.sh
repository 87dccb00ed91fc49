#!/bin/bash
# This session's queue of issue 49's long runs, in order of cost to finish (cheapest first); each resumable.
cd /work/runs
# (ssvae, vqvae, multilabel, the cvae in decisive mode and llm: finished, committed)
/work/runs/decisive10/run.sh mt > logs/decisive_mt.log 2>&1

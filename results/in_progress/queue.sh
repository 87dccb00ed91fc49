#!/bin/bash
# This session's queue of issue 49's long runs, in order of cost to finish (cheapest first); each resumable.
cd /work/runs
# (ssvae, vqvae, multilabel, and the cvae in decisive mode: finished, committed)
/work/runs/decisive10/run.sh mt > logs/decisive_mt.log 2>&1
/work/runs/llm49/run.sh > logs/llm49.log 2>&1

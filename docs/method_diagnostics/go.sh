#!/bin/bash
# Runs the given "variant lam" pairs one after another (one training at a time).
cd "$(dirname "$0")"
mkdir -p logs results
export PYTHONPATH=pkg:. TF_CPP_MIN_LOG_LEVEL=2
while read v l; do
  [ -z "$v" ] && continue
  python run.py --variant $v --lam $l 2>>logs/err_${v}_${l}.txt | tee -a logs/summary.txt
done

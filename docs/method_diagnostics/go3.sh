#!/bin/bash
# Like go.sh, with extra arguments per line: "variant lam [run.py options]".
cd "$(dirname "$0")"
mkdir -p logs results
export PYTHONPATH=pkg:. TF_CPP_MIN_LOG_LEVEL=2
while read v l rest; do
  [ -z "$v" ] && continue
  python run.py --variant $v --lam $l $rest 2>>logs/err_${v}_${l}.txt | tee -a logs/summary.txt
done

#!/bin/bash
# Instructions per decision (valgrind callgrind), two trees, deterministic on a busy host:
#   bench/budget_instructions.sh /work/main /work/wt/i29-budgets
# Per decision = (Ir of 30,000 decisions - Ir of 10,000) / 20,000 (start-up cancels out).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
run() { PYTHONPATH=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$py" "$here/budget_decisions.py" "$2" "$3" 2>&1 | awk '/Collected/ {print $4}'; }
for c in one new; do
  for t in "$@"; do
    a=$(run "$t" "$c" 10000); b=$(run "$t" "$c" 30000)
    echo "$t $c $(( (b - a) / 20000 )) instructions per decision"
  done
done

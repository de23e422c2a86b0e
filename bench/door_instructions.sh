#!/bin/bash
# Instructions per decision of the whole decision door (valgrind callgrind), deterministic on a busy host:
#   bench/door_instructions.sh RULES.yaml TREE...        (STUB=handle|check: see bench/door_decisions.py)
# Per decision = (Ir of 3,000 requests - Ir of 1,000) / 2,000 (start-up cancels out).  Use rules whose
# limit the requests never reach (e.g. bench/http_bench.py's with requests_per_unit: 100000000).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
rules=$1
shift
run() { PYTHONHASHSEED=0 PYTHONPATH=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$py" "$here/door_decisions.py" "$rules" "$2" 2>&1 | awk '/Collected/ {print $4}'; }
for t in "$@"; do
  a=$(run "$t" 1000); b=$(run "$t" 3000)
  echo "$t ${STUB:+STUB=$STUB }$(( (b - a) / 2000 )) instructions per decision"
done

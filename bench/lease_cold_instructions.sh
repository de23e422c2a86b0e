#!/bin/bash
# Instructions per cold decision (valgrind callgrind), leases on vs off, deterministic on a busy host:
#   bench/lease_cold_instructions.sh TREE... [REDIS_URL=redis://127.0.0.1:6379/0 for a real server]
# Per decision = (Ir of 6,000 decisions - Ir of 2,000) / 4,000 (start-up cancels out); Redis stubbed
# unless REDIS_URL is set (bench/lease_cold_decisions.py).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
run() { PYTHONHASHSEED=0 PYTHONPATH=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$py" "$here/lease_cold_decisions.py" "$2" "$3" ${REDIS_URL:-} 2>&1 | awk '/Collected/ {print $4}'; }
for t in "$@"; do
  for side in off on; do
    a=$(run "$t" $side 2000); b=$(run "$t" $side 6000)
    echo "$t $side${REDIS_URL:+ (redis)} $(( (b - a) / 4000 )) instructions per decision"
  done
done

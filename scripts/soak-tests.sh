#!/usr/bin/env bash
# Every test that drives the kernel, systemd or real namespaced traffic (markers netns
# and systemd, wherever they live) N times in a row while both cores are busy: the
# suite must be load-proof (issue 24). Not part of CI (it takes hours); run it and
# report the figures.
#
#   bash scripts/soak-tests.sh [RUNS=20] [extra pytest args...]
#
# Stops at the first red run. Busy loops and their children are killed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
shift || true
busy=()
cleanup() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in 1 2; do ( while :; do :; done ) & busy+=($!); done
start=$(date +%s)
for i in $(seq 1 "$runs"); do
  t0=$(date +%s)
  if ! .venv/bin/python -m pytest -q -x -p no:cacheprovider -m "(netns or systemd) and not vagrant" \
      tests "$@" > "/tmp/soak-tests-$i.log" 2>&1; then
    echo "run $i/$runs: FAILED after $(( $(date +%s) - t0 )) s; see /tmp/soak-tests-$i.log"
    tail -30 "/tmp/soak-tests-$i.log"
    exit 1
  fi
  echo "run $i/$runs: $(tail -1 "/tmp/soak-tests-$i.log") ($(( $(date +%s) - t0 )) s)"
done
echo "soak-tests: $runs runs green in $(( $(date +%s) - start )) s with both cores busy"

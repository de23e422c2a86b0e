#!/usr/bin/env bash
# Every test that drives the kernel, systemd or real namespaced traffic (markers netns
# and systemd, wherever they live) N times in a row while the host is busy: the suite
# must be load-proof (issues 24 and 35). Not part of CI (it takes hours); run it and
# report the figures.
#
#   bash scripts/soak-tests.sh [RUNS=20] [test paths and pytest args... (default: tests)]
#   SOAK_LOAD=heavy SOAK_MAX_SECONDS=3600 bash scripts/soak-tests.sh 10 tests/kernel tests/daemon
#
# SOAK_LOAD=busy (default): two busy loops. SOAK_LOAD=heavy (issue 35: what broke a
# fresh-clone run) adds a loopback HTTP flood (wrk, 2 threads, 16 connections, against
# a sidecar on 127.0.0.1 with a memory store) and a namespace flood (namespaces made,
# flood-pinged on their loopback and deleted in a loop, prefix soakns-<pid>-).
# SOAK_MAX_SECONDS (default 0: no bound) stops before a run that would start after it;
# the report says how many runs ran. Stops at the first red run. Every load process is
# killed on exit and the flood's namespaces deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
shift || true
load=${SOAK_LOAD:-busy}
max_s=${SOAK_MAX_SECONDS:-0}
py=.venv/bin/python
[ -x "$py" ] || py=python3
tmp=$(mktemp -d /tmp/soak-tests.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^soakns-$$-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in 1 2; do ( while :; do :; done ) & pids+=($!); done
if [ "$load" = heavy ]; then
  command -v wrk >/dev/null || { echo "SOAK_LOAD=heavy needs wrk (apt-get install wrk)"; exit 64; }
  port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$tmp/soak.yaml" <<YAML
version: 1
http:
  domain: soak
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 1000}
YAML
  $py -m netlimit.cli sidecar --config "$tmp/soak.yaml" --listen "127.0.0.1:$port" > "$tmp/sidecar.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    $py -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2).close()" 2>/dev/null && break
    sleep 0.1
  done
  # the HTTP flood: wrk in 60 s rounds for as long as the soak runs
  ( while :; do wrk -t2 -c16 -d60s "http://127.0.0.1:$port/v1/check" > /dev/null 2>&1 || sleep 1; done ) &
  pids+=($!)
  # the namespace flood: one namespace at a time, made, flood-pinged (bounded), deleted
  ( k=0; while :; do
      k=$((k + 1)); ns="soakns-$$-$k"
      ip netns add "$ns" && ip -n "$ns" link set lo up \
        && timeout 5 ip netns exec "$ns" ping -q -f -c 20000 127.0.0.1 > /dev/null 2>&1
      ip netns del "$ns" 2>/dev/null || true
    done ) &
  pids+=($!)
fi
start=$(date +%s)
ran=0
for i in $(seq 1 "$runs"); do
  if [ "$max_s" -gt 0 ] && [ $(( $(date +%s) - start )) -ge "$max_s" ]; then
    echo "soak-tests: time bound of $max_s s reached before run $i"
    break
  fi
  t0=$(date +%s)
  if ! $py -m pytest -q -x -p no:cacheprovider -m "(netns or systemd) and not vagrant" \
      "${@:-tests}" > "/tmp/soak-tests-$i.log" 2>&1; then
    echo "run $i/$runs: FAILED after $(( $(date +%s) - t0 )) s ($load load); see /tmp/soak-tests-$i.log"
    tail -30 "/tmp/soak-tests-$i.log"
    exit 1
  fi
  ran=$i
  echo "run $i/$runs: $(tail -1 "/tmp/soak-tests-$i.log") ($(( $(date +%s) - t0 )) s, $load load)"
done
echo "soak-tests: $ran of $runs runs green in $(( $(date +%s) - start )) s under the $load load"

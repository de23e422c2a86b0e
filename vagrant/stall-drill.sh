#!/usr/bin/env bash
# The scenario with the limiter VM stalled: vagrant/run.sh, and meanwhile the
# limiter's qemu is stopped (SIGSTOP) for STALL_S seconds a few seconds into
# each measuring phase (L3 and L4 floods, bandwidth, reload) — what a busy CI
# host did to one run (a 2.4 s pause in the SYN flood). Every check must still
# be within tolerance: the floods and clients are judged by a token bucket
# replayed over the arrivals as timed, the goodput is measured again after a
# pause. Exit status: run.sh's.
#
#   sudo vagrant/stall-drill.sh        # STALL_S=2.5 by default
set -Eeuo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vagrant/common.sh
. "$HERE/common.sh"
STALL_S=${STALL_S:-2.5}
LOGS=$NETLIMIT_VAGRANT_CACHE/logs
[ "$(id -u)" = 0 ] || { echo "stall-drill: run as root" >&2; exit 64; }
mkdir -p "$LOGS"

before=$(ls -t "$LOGS" | head -1 || true)
bash "$HERE/run.sh" &
RUN=$!
STALLER=""
cleanup() {
  [ -n "$STALLER" ] && kill "$STALLER" 2>/dev/null || true
  # never leave a VM stopped
  for p in $(pgrep -f "guest=netlimit-limiter" || true); do kill -CONT "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

stall() {  # $1 = scenario.log, $2 = a phase's header in it, $3 = seconds into the phase
  local log=$1 marker=$2 delay=$3 pid
  for _ in $(seq 1 2400); do  # up to 20 min: box, up, provisioning
    grep -q -- "$marker" "$log" 2>/dev/null && break
    kill -0 "$RUN" 2>/dev/null || return 0
    sleep 0.5
  done
  grep -q -- "$marker" "$log" 2>/dev/null || return 0
  pid=$(pgrep -f "guest=netlimit-limiter" | head -1) || return 0
  sleep "$delay"
  kill -STOP "$pid" && echo "stall-drill: limiter stopped ${STALL_S} s, ${delay} s into '$marker'" >&2
  sleep "$STALL_S"
  kill -CONT "$pid"
}

(
  dir=""
  for _ in $(seq 1 600); do
    d=$(ls -t "$LOGS" | head -1 || true)
    [ -n "$d" ] && [ "$d" != "$before" ] && { dir=$LOGS/$d; break; }
    sleep 0.5
  done
  [ -n "$dir" ] || exit 0
  stall "$dir/scenario.log" "--- L3 udp flood" 5
  stall "$dir/scenario.log" "--- L4 syn flood" 5
  stall "$dir/scenario.log" "--- bandwidth" 5
  stall "$dir/scenario.log" "--- reload" 12
) &
STALLER=$!
rc=0
wait "$RUN" || rc=$?
exit "$rc"

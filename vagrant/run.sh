#!/usr/bin/env bash
# netlimit on real VMs, one command: build (or reuse) the offline box, bring
# up limiter/client/flood, run the scenario, destroy the VMs — also on failure
# or Ctrl-C. Exit status: the scenario's (0 = every check within tolerance).
#
#   sudo vagrant/run.sh            # or: sudo make vagrant-test
#
# Where libvirt runs:
#   * a machine with systemd as PID 1 and a libvirtd answering on
#     qemu:///system (a workstation): that libvirt, and KVM when it works;
#   * otherwise (CI, containers, VMs without systemd): its own libvirtd and
#     virtlogd, started here inside a network namespace this script creates
#     (nlvg-<pid>), so libvirt's bridges, dnsmasq and NAT never touch the
#     machine's own network; vagrant and the scenario run in it too.
# KVM or software emulation: NETLIMIT_LIBVIRT_DRIVER=kvm|qemu, else a 15 s
# probe boots the box's kernel under KVM and falls back to QEMU/TCG when it
# does not start (as on Firecracker/PVM hosts, where /dev/kvm exists but a
# stock kernel hangs).
#
# Other knobs: NETLIMIT_VAGRANT_KEEP=1 leaves the VMs up (no destroy);
# NETLIMIT_SCENARIO_RUNS=N runs the scenario N times on the same VMs;
# NETLIMIT_VAGRANT_CACHE (/var/cache/netlimit-vagrant) holds box, wheels,
# Vagrant's box store, the libvirt pool, and logs/ of every run.
set -Eeuo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vagrant/common.sh
. "$HERE/common.sh"
CACHE=$NETLIMIT_VAGRANT_CACHE

log() { echo "run.sh: $*" >&2; }
die() { echo "run.sh: $*" >&2; exit 64; }
[ "$(id -u)" = 0 ] || die "run as root (box build, libvirt, network namespace)"
for t in vagrant virsh qemu-system-x86_64 qemu-img ip ssh python3; do
  command -v "$t" >/dev/null || die "$t missing: apt-get install vagrant vagrant-libvirt libvirt-daemon-system \
libvirt-daemon-driver-qemu libvirt-clients dnsmasq-base ebtables qemu-system-x86 qemu-utils debootstrap"
done
vagrant plugin list 2>/dev/null | grep -q vagrant-libvirt || die "the vagrant-libvirt plugin is missing (apt-get install vagrant-libvirt)"

mkdir -p "$CACHE/logs"
exec 7>"$CACHE/run.lock"
flock -n 7 || die "another vagrant run holds $CACHE/run.lock: never two at once"

T0=$(date +%s)
declare -A T=()
STAMP=$(date +%Y%m%d-%H%M%S)
LOGDIR=$CACHE/logs/$STAMP
mkdir -p "$LOGDIR"
export NETLIMIT_CONSOLE_DIR=$LOGDIR
export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_LOG=${VAGRANT_LOG:-error}
export VAGRANT_CWD=$HERE
cd "$HERE"

NS=""
OWN_LIBVIRT=0
UP_STARTED=0
IN_NS=()
PIDS_DIR=$LOGDIR/pids

CHILD=""
run_child() {   # run a long command in the background and wait: a TERM to run.sh then acts at once
  "$@" &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  return $rc
}

stop_child() {
  [ -n "$CHILD" ] || return 0
  kill -TERM "$CHILD" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.3; done
  kill -KILL "$CHILD" 2>/dev/null
  wait "$CHILD" 2>/dev/null
  CHILD=""
}

timed() {   # timed NAME CMD...: run, record seconds
  local name=$1; shift
  local s; s=$(date +%s)
  local rc=0
  "$@" || rc=$?
  T[$name]=$(( $(date +%s) - s ))
  return $rc
}

report_times() {
  local total=$(( $(date +%s) - T0 ))
  {
    echo "run.sh timings (s): box ${T[box]:--} | wheels ${T[wheels]:--} | libvirt ${T[libvirt]:--} |" \
         "vagrant up ${T[up]:--} | scenario ${T[scenario]:--} | destroy ${T[destroy]:--} | total $total"
  } | tee -a "$LOGDIR/timings.txt" >&2
}

vag() { "${IN_NS[@]}" vagrant "$@"; }
vsh() { "${IN_NS[@]}" virsh -c qemu:///system "$@"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM ERR
  set +e
  # a signal arrives while run_child waits, i.e. inside a redirection to a log:
  # speak to the original stdout/stderr again
  exec 1>&3 2>&4
  stop_child
  if [ "$UP_STARTED" = 1 ]; then
    if [ "${NETLIMIT_VAGRANT_KEEP:-0}" = 1 ]; then
      log "NETLIMIT_VAGRANT_KEEP=1: VMs left running (namespace $NS); destroy with: cd vagrant && ${IN_NS[*]} vagrant destroy -f"
      report_times
      exit $rc
    fi
    log "destroying the VMs"
    local s; s=$(date +%s)
    timeout 600 "${IN_NS[@]}" vagrant destroy -f >"$LOGDIR/destroy.log" 2>&1 || log "vagrant destroy failed (see $LOGDIR/destroy.log)"
    # anything vagrant could not remove (a half-created domain)
    for d in $(vsh list --all --name 2>/dev/null | grep '^netlimit-' || true); do
      vsh destroy "$d" >/dev/null 2>&1; vsh undefine "$d" --remove-all-storage >/dev/null 2>&1
      log "removed leftover domain $d"
    done
    T[destroy]=$(( $(date +%s) - s ))
  fi
  if [ "$OWN_LIBVIRT" = 1 ]; then
    # our libvirtd's networks (vagrant's and Debian's autostarted "default"): stop, and
    # undefine the ones vagrant defined, so nothing persists in /etc/libvirt
    for n in $(vsh net-list --all --name 2>/dev/null); do
      vsh net-destroy "$n" >/dev/null 2>&1
      case $n in netlimit-private|vagrant-libvirt) vsh net-undefine "$n" >/dev/null 2>&1 ;; esac
    done
    vsh pool-destroy netlimit-vagrant >/dev/null 2>&1
    for f in libvirtd virtlogd; do
      if [ -s "$PIDS_DIR/$f.pid" ]; then
        local pid; pid=$(cat "$PIDS_DIR/$f.pid")
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null
      fi
    done
  fi
  if [ -n "$NS" ]; then
    # whatever still runs in our namespace was started by this run (dnsmasq, qemu)
    for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
    sleep 1
    for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$NS" 2>/dev/null && log "namespace $NS removed"
  fi
  report_times
  log "logs: $LOGDIR"
  exit $rc
}
exec 3>&1 4>&2
# set -e stops at the first failing command: say which, or a CI log shows only "exit 1"
trap 'log "failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. the box and the wheels --------------------------------------------------------------
log "box (built once, cached in $CACHE)"
timed box "$HERE/build-box.sh" >"$LOGDIR/box-version.txt" 2> >(tee "$LOGDIR/build-box.log" >&2)
BOX_VERSION=$(tail -n1 "$LOGDIR/box-version.txt")
log "wheels of this checkout and its dependencies"
timed wheels "$HERE/wheels.sh" >"$LOGDIR/wheels-dir.txt" 2>"$LOGDIR/wheels.log" \
  || { tail -n 30 "$LOGDIR/wheels.log" >&2; exit 1; }
export NETLIMIT_WHEELS; NETLIMIT_WHEELS=$(tail -n1 "$LOGDIR/wheels-dir.txt")

# --- 2. libvirt -------------------------------------------------------------------------------
probe_kvm() {   # does a stock kernel start under KVM here? (15 s at most)
  [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  local k
  k=$(ls "$VAGRANT_HOME"/boxes/*/"$BOX_VERSION"/libvirt/vmlinuz 2>/dev/null | head -n1)
  [ -n "$k" ] || return 1
  timeout 15 qemu-system-x86_64 -enable-kvm -cpu host -m 256 -display none -nodefaults -serial stdio \
    -kernel "$k" -append "console=ttyS0 panic=-1" -no-reboot -nic none 2>&1 | grep -q -m1 "Linux version"
}

start_own_libvirt() {
  if virsh -c qemu:///system version >/dev/null 2>&1; then
    die "a libvirtd already answers on /run/libvirt, but this machine has no systemd as PID 1: refusing to \
put VMs on a libvirt whose networks may live in the machine's own namespace (stop it first)"
  fi
  NS=nlvg-$$
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  IN_NS=(ip netns exec "$NS")
  mkdir -p "$PIDS_DIR"
  OWN_LIBVIRT=1
  # Both daemons in one mount namespace (ip netns exec makes a private one). When
  # KVM is not used but /dev/kvm exists, libvirt's capability probe finds KVM
  # while its "usable by the qemu user" check does not (here /dev/kvm is 0600
  # root), so it declares its cache stale on every call and re-probes QEMU
  # forever, stalling vagrant: hide /dev/kvm in this mount namespace only (an
  # empty root-only file over it), and — since libvirt's per-VM /dev namespace
  # cannot carry that file mount — turn that namespace off in a private copy of
  # qemu.conf. Nothing changes outside this run's mount namespace.
  local hide=no
  [ "$NETLIMIT_LIBVIRT_DRIVER" = qemu ] && [ -e /dev/kvm ] && hide=yes
  "${IN_NS[@]}" sh -c '
    set -e
    if [ "$1" = yes ]; then
      : >"$2/no-kvm"; chmod 0600 "$2/no-kvm"
      mount --bind "$2/no-kvm" /dev/kvm
      { cat /etc/libvirt/qemu.conf; echo "namespaces = []"; } >"$2/qemu.conf"
      mount --bind "$2/qemu.conf" /etc/libvirt/qemu.conf
    fi
    virtlogd -d -p "$2/virtlogd.pid"
    libvirtd -d -p "$2/libvirtd.pid"' sh "$hide" "$PIDS_DIR"
  local i
  for i in $(seq 1 60); do
    vsh version >/dev/null 2>&1 && break
    [ "$i" = 60 ] && die "libvirtd did not answer in 30 s"
    sleep 0.5
  done
  # A transient pool in the cache: nothing persists in /etc/libvirt, the uploaded
  # box volume survives for the next run. (A killed run leaves libvirt's record of
  # it in /run/libvirt: replace it.)
  mkdir -p "$CACHE/pool"
  find "$CACHE/pool" -maxdepth 1 -name '*_vagrant_box_image_*' ! -name "*_${BOX_VERSION}_*" -delete
  vsh pool-destroy netlimit-vagrant >/dev/null 2>&1 || true
  vsh pool-create-as netlimit-vagrant dir --target "$CACHE/pool" >/dev/null
  export NETLIMIT_LIBVIRT_POOL=netlimit-vagrant
  log "own libvirtd in namespace $NS (pool $CACHE/pool$([ $hide = yes ] && echo ', /dev/kvm hidden from it'))"
}

s=$(date +%s)
if [ -z "${NETLIMIT_LIBVIRT_DRIVER:-}" ]; then
  # the verdict holds until the machine reboots
  probe_key="$(cat /proc/sys/kernel/random/boot_id) $BOX_VERSION"
  if [ -f "$CACHE/kvm-probe" ] && [ "$(head -n1 "$CACHE/kvm-probe")" = "$probe_key" ]; then
    NETLIMIT_LIBVIRT_DRIVER=$(tail -n1 "$CACHE/kvm-probe")
  else
    if probe_kvm; then NETLIMIT_LIBVIRT_DRIVER=kvm; else NETLIMIT_LIBVIRT_DRIVER=qemu; fi
    printf '%s\n%s\n' "$probe_key" "$NETLIMIT_LIBVIRT_DRIVER" >"$CACHE/kvm-probe"
  fi
fi
export NETLIMIT_LIBVIRT_DRIVER
log "libvirt driver: $NETLIMIT_LIBVIRT_DRIVER$([ "$NETLIMIT_LIBVIRT_DRIVER" = qemu ] && echo ' (software emulation, TCG)')"
if [ -d /run/systemd/system ] && virsh -c qemu:///system version >/dev/null 2>&1; then
  log "using this machine's libvirt (systemd host)"
else
  start_own_libvirt
fi
T[libvirt]=$(( $(date +%s) - s ))

# --- 3. the VMs ---------------------------------------------------------------------------------
# A run killed with -9 (or a machine that lost power) leaves its domains, disks
# and networks defined in /etc/libvirt and Vagrant's ids in .vagrant/: a fresh
# `vagrant up` would then trip over "domain already exists". Sweep them first.
sweep_leftovers() {
  local d n found=0
  for d in $(vsh list --all --name 2>/dev/null | grep '^netlimit-' || true); do
    vsh destroy "$d" >/dev/null 2>&1 || true      # "not running" is fine
    vsh undefine "$d" --remove-all-storage >/dev/null 2>&1 || log "could not undefine domain $d"
    log "removed domain $d left by an earlier run"; found=1
  done
  for n in netlimit-private vagrant-libvirt; do
    if vsh net-info "$n" >/dev/null 2>&1; then
      vsh net-destroy "$n" >/dev/null 2>&1 || true
      vsh net-undefine "$n" >/dev/null 2>&1 || log "could not undefine network $n"
      log "removed network $n left by an earlier run"; found=1
    fi
  done
  for d in limiter client flood; do
    if vsh vol-info --pool "${NETLIMIT_LIBVIRT_POOL:-default}" "netlimit-$d.img" >/dev/null 2>&1; then
      vsh vol-delete --pool "${NETLIMIT_LIBVIRT_POOL:-default}" "netlimit-$d.img" >/dev/null 2>&1 || true
      found=1
    fi
  done
  if [ -d "$HERE/.vagrant/machines" ]; then rm -rf "$HERE/.vagrant/machines"; fi
  [ "$found" = 0 ] || log "earlier run's leftovers removed"
}
sweep_leftovers

log "vagrant up limiter client flood (log: $LOGDIR/up.log)"
UP_STARTED=1
s=$(date +%s)
rc=0
run_child "${IN_NS[@]}" vagrant up --provider libvirt > >(stdbuf -oL tr '\r' '\n' | grep --line-buffered -v 'Progress:' >"$LOGDIR/up.log") 2>&1 || rc=$?
T[up]=$(( $(date +%s) - s ))
if [ "$rc" != 0 ]; then
  sleep 1
  grep -v ' WARN ' "$LOGDIR/up.log" | tail -n 40 >&2
  for vm in limiter client flood; do
    [ -s "$LOGDIR/$vm.log" ] && { log "console of $vm:"; tail -n 15 "$LOGDIR/$vm.log" >&2; }
  done
  log "vagrant up failed after ${T[up]} s"
  exit 1
fi
log "VMs up and provisioned in ${T[up]} s"
vag ssh-config >"$LOGDIR/ssh-config" 2>>"$LOGDIR/up.log"

# --- 4. the scenario ------------------------------------------------------------------------------
log "scenario (log: $LOGDIR/scenario.log)"
SC_PY=python3
if ! python3 -c 'import yaml' 2>/dev/null; then      # the scenario reads limiter.yaml with PyYAML
  SC_PY=$CACHE/build-venv/bin/python
  "$SC_PY" -c 'import yaml' 2>/dev/null || "$CACHE/build-venv/bin/pip" install -q --no-index --find-links "$NETLIMIT_WHEELS" pyyaml
fi
s=$(date +%s)
rc=0
for i in $(seq 1 "${NETLIMIT_SCENARIO_RUNS:-1}"); do   # more than 1: measure the spread
  run_child "${IN_NS[@]}" "$SC_PY" "$HERE/scenario.py" vagrant --ssh-config "$LOGDIR/ssh-config" \
    > >(tee -a "$LOGDIR/scenario.log") 2>&1 || rc=$?
done
T[scenario]=$(( $(date +%s) - s ))
[ "$rc" = 0 ] || { log "scenario failed (exit $rc)"; rc=1; }
exit "$rc"

#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for netlimit, as root: the system tools the
# tests and the demo drive (iptables, tc, iperf3, redis, nginx, wrk ...) and the
# package with its test extra in ./.venv. Safe to run again: it only adds what
# is missing. Used by README's two commands and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  iptables iproute2 conntrack        # the kernel layer: iptables-legacy, tc, ip netns
  iperf3 hping3 netcat-openbsd       # traffic for tests, demo, benchmarks
  redis-server nginx wrk             # the HTTP layer's real peers
  systemd systemd-container debootstrap util-linux   # units tested under a real systemd (nspawn)
  python3-venv
)

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and the tests create network namespaces)" >&2
  exit 64
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  # Another apt/dpkg may hold the lock (unattended upgrades, a CI image still
  # booting): wait for it up to 10 minutes instead of failing.
  apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 -q)
  apt-get "${apt_opts[@]}" update
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup.sh: netlimit needs Python >= 3.11 ($PY is $("$PY" -V 2>&1))" >&2
  exit 64
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
echo "setup.sh: ready — $(.venv/bin/netlimit --version)"

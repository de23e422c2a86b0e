#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for netlimit, as root: the system tools the
# tests and the demo drive (nft, iptables, tc, iperf3, redis, nginx, wrk ...) and the
# package with its test extra in ./.venv. Safe to run again: it only adds what
# is missing. Used by README's two commands and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  iptables iproute2 conntrack        # the kernel layer: iptables-legacy, tc, ip netns
  nftables                           # the nftables backend (nft -f writes table inet netlimit; auto's pick on nf_tables hosts)
  ipset                              # the legacy backends' ban sets (netlimit-bans4/6: hash:net with timeouts)
  iperf3 hping3 netcat-openbsd       # traffic for tests, demo, benchmarks
  redis-server nginx wrk             # the HTTP layer's real peers
  prometheus tmux                    # monitoring: dashboard queries and alert rules (promtool), `netlimit top` in a terminal
  chromium chromium-driver           # netlimit simulate --report opened in a real headless browser (tests/simulate)
  goaccess                           # the log analyser the simulate benchmark is measured beside
  systemd systemd-container debootstrap util-linux   # units tested under a real systemd (nspawn)
  python3-venv                       # the package's virtual environment
  gcc libc6-dev python3-dev          # the compiled door (netlimit/compiled.py: mypyc's C), built by the release and tests/sidecar/test_compiled_door.py
  # the release (scripts/release.sh, scripts/release-test.sh): sdist/wheel, the .deb with
  # its lint, pipx for the install check, the OCI image of the sidecar
  python3-build debhelper dh-virtualenv lintian pipx buildah podman runc uidmap
  groff-base                         # the generated man pages are linted with groff (tests/test_manpages_completion.py)
  # three real VMs (tests/vagrant, vagrant/run.sh): Vagrant with libvirt, QEMU
  # (software emulation where KVM is unusable), libvirt's own dnsmasq for DHCP
  vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
  dnsmasq-base ebtables qemu-system-x86 qemu-utils
  # the XDP drop path (netlimit/kernel/xdp, issue 34): clang -target bpf builds the object,
  # libbpf1 (pulled by libbpf-dev) loads it through ctypes; bpftool/xdp-tools to inspect,
  # netsniff-ng for trafgen (a fast packet generator: no pktgen module on these kernels)
  clang llvm libbpf-dev bpftool xdp-tools netsniff-ng
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
  # Without systemd as PID 1 (containers, CI), a package's init script would start
  # its daemon in the machine's own network namespace — libvirtd with its NAT'ed
  # "default" network, dnsmasq, nginx, redis. Nothing here needs them running
  # (tests and vagrant/run.sh start their own, in namespaces or on loopback), so
  # forbid service starts for this install unless a policy is already in place.
  policy_added=0
  if [ ! -d /run/systemd/system ] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# netlimit setup.sh: no service starts during this install\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  rc=0
  DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" || rc=$?
  [ "$policy_added" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { echo "setup.sh: apt-get install failed (exit $rc)" >&2; exit "$rc"; }
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
# the XDP object (netlimit/kernel/xdp/netlimit_xdp.o, package data; rebuilt when stale)
.venv/bin/python -m netlimit.kernel.xdp.build
echo "setup.sh: ready — $(.venv/bin/netlimit --version)"

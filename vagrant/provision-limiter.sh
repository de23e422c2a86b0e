#!/usr/bin/env bash
# Provision the `limiter` VM (run as root by Vagrant; the VM is offline).
#
# The install is README's: a venv, pip install of netlimit from the wheels
# built on the host (the checkout's wheel and its dependencies, copied in to
# /tmp/netlimit-wheels), then `netlimit install-service`; then the scenario's
# config, the sidecar in front of a small upstream app, everything started
# through systemd. The scenario's three small files arrive base64-encoded in
# the environment (one SSH round trip instead of three uploads).
set -euo pipefail
MY_IP=${1:?usage: provision-limiter.sh PRIVATE_IP}
WHEELS=/tmp/netlimit-wheels
t0=$(date +%s)
say() { echo "provision: $* ($(( $(date +%s) - t0 )) s)"; }

# --- netlimit, as the README installs it -------------------------------------------
python3 -m venv /opt/netlimit
say "venv /opt/netlimit"
/opt/netlimit/bin/pip install -q --no-index --find-links "$WHEELS" netlimit
say "pip install netlimit ($(/opt/netlimit/bin/netlimit --version))"
/opt/netlimit/bin/netlimit install-service

# --- the scenario's limiter ----------------------------------------------------------------
install -d /usr/local/lib/netlimit-scenario
echo "$NETLIMIT_LIMITER_YAML" | base64 -d >/usr/local/lib/netlimit-scenario/limiter.yaml
echo "$NETLIMIT_UPSTREAM_PY" | base64 -d >/usr/local/lib/netlimit-scenario/upstream.py
echo "$NETLIMIT_UPSTREAM_UNIT" | base64 -d >/etc/systemd/system/netlimit-upstream.service
chmod 0644 /usr/local/lib/netlimit-scenario/* /etc/systemd/system/netlimit-upstream.service

# The bandwidth rule names the private interface: eth1 in the netlimit box
# (fixed here if another box names it otherwise).
IFACE=$(ip -o -4 addr show | awk -v a="$MY_IP" '{split($4, x, "/"); if (x[1] == a) print $2}')
[ -n "$IFACE" ] || { echo "provision: no interface has $MY_IP" >&2; exit 1; }
install -m 0644 /usr/local/lib/netlimit-scenario/limiter.yaml /etc/netlimit/netlimit.yaml
[ "$IFACE" = eth1 ] || sed -i -e "s/interface: eth1\b/interface: $IFACE/" -e "s/interfaces: \[eth1\]/interfaces: [$IFACE]/" /etc/netlimit/netlimit.yaml
/opt/netlimit/bin/netlimit validate /etc/netlimit/netlimit.yaml
# A file with `xdp:` needs the drop-in that lets netlimitd load BPF (shipped in the wheel)
if grep -q '^xdp:' /etc/netlimit/netlimit.yaml; then
  install -d /etc/systemd/system/netlimitd.service.d
  install -m 0644 /opt/netlimit/share/netlimit/systemd/netlimitd-xdp.conf /etc/systemd/system/netlimitd.service.d/xdp.conf
  say "xdp: drop-in installed"
fi
echo "NETLIMIT_SIDECAR_ARGS=--listen 0.0.0.0:8080 --upstream http://127.0.0.1:8081" >/etc/default/netlimit-sidecar

# Software emulation only: Python needs ~40 s of emulated CPU to start netlimitd,
# more than systemd's default 90 s start timeout when the host is busy.
if [ "$(systemd-detect-virt 2>/dev/null || true)" = qemu ]; then
  mkdir -p /etc/systemd/system/netlimitd.service.d
  printf '# added by the netlimit scenario: QEMU software emulation starts Python slowly\n[Service]\nTimeoutStartSec=600\nWatchdogSec=300\n' \
    >/etc/systemd/system/netlimitd.service.d/emulation-timeouts.conf
fi

systemctl daemon-reload
systemctl enable netlimit-upstream.service netlimitd.service netlimit-sidecar.service
failed=0
for u in netlimit-upstream netlimitd netlimit-sidecar; do
  systemctl start "$u.service" || true
  if ! systemctl is-active --quiet "$u"; then
    systemctl status --no-pager "$u" || true
    journalctl -u "$u" --no-pager -n 40 || true
    echo "provision: $u is not running" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
/opt/netlimit/bin/netlimit status
say "limiter ready"

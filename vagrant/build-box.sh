#!/usr/bin/env bash
# Build the offline Debian 12 Vagrant box (libvirt provider) the netlimit
# scenario runs on, and `vagrant box add` it. No download from Vagrant Cloud:
# the root file system is debootstrapped from the apt sources this machine is
# already configured with (no mirror is hard-coded).
#
#   sudo vagrant/build-box.sh          # build if missing, add if not added; prints the box version
#   sudo vagrant/build-box.sh --force  # rebuild
#
# Cached in $NETLIMIT_VAGRANT_CACHE (/var/cache/netlimit-vagrant): the
# debootstrap stage, the .box file and Vagrant's box store (VAGRANT_HOME). A
# change to this script or to vagrant/box/* gives a new box version.
#
# What is in the box, and why:
#   * systemd, udev, dbus, openssh-server, sudo, python3 (+venv), iptables,
#     iproute2, the stock Debian kernel (linux-image-amd64) with an initrd;
#   * user `vagrant` with Vagrant's insecure public key (from the installed
#     vagrant package) and passwordless sudo; Vagrant swaps in a fresh key at
#     first `vagrant up`;
#   * an EMPTY /etc/machine-id and no SSH host keys: both are made at first
#     boot, so VMs from one box get distinct DHCP client ids and host keys;
#   * DHCP (systemd-networkd) on eth0 only, the management NIC, so the static
#     private-network address Vagrant writes for eth1 is the one that applies;
#   * direct kernel boot: vmlinuz + initrd.img sit beside box.img in the box,
#     the box's Vagrantfile points libvirt at them (no bootloader in the image).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=vagrant/common.sh
. "$HERE/common.sh"

FORCE=0
[ "${1:-}" = "--force" ] && FORCE=1

log() { echo "build-box: $*" >&2; }
die() { echo "build-box: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot, mkfs)"
for tool in debootstrap qemu-img mkfs.ext4 vagrant python3 sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install debootstrap qemu-utils e2fsprogs vagrant vagrant-libvirt"
done

HASH=$(box_recipe_hash)
VERSION="1.0.$((16#${HASH:0:7}))"
CACHE=$NETLIMIT_VAGRANT_CACHE
BOXDIR=$CACHE/box
BOXFILE=$BOXDIR/netlimit-debian12-$HASH.box
CATALOG=$BOXDIR/netlimit-debian12.json
BUILD=$CACHE/build
BASE=$BUILD/base            # pristine debootstrap output (cached)
ROOTFS=$BUILD/rootfs        # a fresh copy of it, configured for the box
mkdir -p "$CACHE" "$BOXDIR" "$VAGRANT_HOME"

exec 9>"$CACHE/build.lock"
flock 9

# Never rm -rf a tree with /dev or /proc still bound inside (a killed earlier run).
unmount_under() {
  local m
  awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
}

box_added() {
  vagrant box list --machine-readable 2>/dev/null | python3 -c '
import sys
name, version = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split(",") for l in sys.stdin]
boxes = [r[3] for r in rows if len(r) > 3 and r[2] == "box-name"]
vers = [r[3] for r in rows if len(r) > 3 and r[2] == "box-version"]
sys.exit(0 if (name, version) in zip(boxes, vers) else 1)' "$NETLIMIT_BOX_NAME" "$VERSION"
}

if [ $FORCE = 0 ] && [ -s "$BOXFILE" ] && box_added; then
  log "box $NETLIMIT_BOX_NAME $VERSION is built and added (cache $CACHE)"
  echo "$VERSION"
  exit 0
fi

if [ $FORCE = 1 ] || [ ! -s "$BOXFILE" ]; then
  t0=$(date +%s)
  MIRROR=$(apt_mirror)
  VAGRANT_PUB=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub \
                   /opt/vagrant/embedded/gems/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -n1 || true)
  [ -n "$VAGRANT_PUB" ] || die "Vagrant's insecure public key (keys/vagrant.pub of the vagrant gem) not found"

  mounted=()
  cleanup() {
    local m
    for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  }
  trap cleanup EXIT

  PACKAGES=systemd,systemd-sysv,udev,dbus,kmod,openssh-server,sudo,python3,python3-venv,iptables,iproute2,netbase,procps,iputils-ping,libbpf1,ipset,linux-image-amd64,initramfs-tools
  STAGE_KEY="$NETLIMIT_BOX_SUITE $MIRROR $PACKAGES"
  if [ $FORCE = 1 ] || [ ! -d "$BASE" ] || [ ! -f "$BUILD/debootstrap.done" ] || [ "$(cat "$BUILD/debootstrap.done")" != "$STAGE_KEY" ]; then
    unmount_under "$BUILD"
    rm -rf --one-file-system "$BUILD"
    mkdir -p "$BUILD"
    log "debootstrap $NETLIMIT_BOX_SUITE from $MIRROR (a few minutes; log: $BUILD/debootstrap.log)"
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$NETLIMIT_BOX_SUITE" "$BASE" "$MIRROR" \
         >"$BUILD/debootstrap.log" 2>&1; then
      tail -n 30 "$BUILD/debootstrap.log" >&2
      die "debootstrap failed"
    fi
    # the stage stays pristine: a recipe change below does not download again
    echo "$STAGE_KEY" >"$BUILD/debootstrap.done"
    log "debootstrap done in $(( $(date +%s) - t0 )) s"
  else
    log "reusing the debootstrap stage in $BASE"
  fi
  unmount_under "$ROOTFS"
  rm -rf --one-file-system "$ROOTFS"
  cp -a "$BASE" "$ROOTFS"

  in_root() { chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
  mount -t proc proc "$ROOTFS/proc"; mounted+=("$ROOTFS/proc")
  mount -t sysfs sysfs "$ROOTFS/sys"; mounted+=("$ROOTFS/sys")
  mount --bind /dev "$ROOTFS/dev"; mounted+=("$ROOTFS/dev")

  log "configuring the image"
  echo "netlimit-box" >"$ROOTFS/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\tnetlimit-box\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOTFS/etc/hosts"
  printf '/dev/vda\t/\text4\tdefaults,noatime\t0\t1\n' >"$ROOTFS/etc/fstab"
  # the machine's own apt source, for whoever uses the VM online later
  echo "deb $MIRROR $NETLIMIT_BOX_SUITE main" >"$ROOTFS/etc/apt/sources.list"
  # offline: no resolver; names the scenario needs are in /etc/hosts
  echo "# no DNS in the netlimit test box" >"$ROOTFS/etc/resolv.conf"

  # A small initrd: only what finds and mounts /dev/vda (fast to unpack under TCG).
  sed -i 's/^MODULES=.*/MODULES=list/; s/^COMPRESS=.*/COMPRESS=gzip/' "$ROOTFS/etc/initramfs-tools/initramfs.conf"
  grep -q '^COMPRESS=' "$ROOTFS/etc/initramfs-tools/initramfs.conf" || echo COMPRESS=gzip >>"$ROOTFS/etc/initramfs-tools/initramfs.conf"
  printf '%s\n' virtio_pci virtio_blk virtio_net ext4 crc32c_generic >"$ROOTFS/etc/initramfs-tools/modules"
  in_root update-initramfs -u -k all >"$BUILD/initramfs.log" 2>&1 || { cat "$BUILD/initramfs.log" >&2; die "update-initramfs failed"; }

  # networking: systemd-networkd, DHCP on the management NIC only
  rm -f "$ROOTFS"/etc/systemd/network/*.network
  install -m 0644 "$HERE/box/90-netlimit-mgmt.network" "$ROOTFS/etc/systemd/network/90-netlimit-mgmt.network"
  in_root systemctl enable systemd-networkd.service >/dev/null 2>&1
  # Boot time: under software emulation every unit and module load costs
  # seconds, so leave out what a throw-away test VM never uses. Nothing here
  # is something netlimit relies on (it needs iptables, tc, netlink, systemd).
  #  * units: nothing waits for "online" (Vagrant waits for SSH itself), no
  #    periodic maintenance, no debug/trace/hugepage mounts, no local console
  in_root systemctl mask systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer dpkg-db-backup.timer getty@tty1.service \
    sys-kernel-debug.mount sys-kernel-tracing.mount dev-hugepages.mount systemd-network-generator.service \
    modprobe@drm.service modprobe@fuse.service modprobe@efi_pstore.service modprobe@dm_mod.service \
    modprobe@loop.service systemd-pstore.service >/dev/null 2>&1
  mkdir -p "$ROOTFS/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"$ROOTFS/etc/systemd/journald.conf.d/netlimit-box.conf"
  #  * modules for emulated hardware nothing here uses (floppy, PC speaker,
  #    wireless regulatory, nested KVM, legacy IDE/USB, framebuffer)
  printf 'blacklist %s\n' floppy pcspkr cfg80211 rfkill kvm kvm_amd kvm_intel ccp drm bochs \
    ata_piix ata_generic uhci_hcd ehci_hcd usbcore i2c_piix4 serio_raw psmouse joydev \
    >"$ROOTFS/etc/modprobe.d/netlimit-box.conf"

  # SSH: no host keys in the image; made at first boot
  rm -f "$ROOTFS"/etc/ssh/ssh_host_*
  install -m 0644 "$HERE/box/ssh-host-keys.service" "$ROOTFS/etc/systemd/system/ssh-host-keys.service"
  in_root systemctl enable ssh-host-keys.service ssh.service >/dev/null 2>&1

  # the vagrant user: insecure key, passwordless sudo
  in_root id vagrant >/dev/null 2>&1 || in_root useradd -m -s /bin/bash -U vagrant
  install -d -m 0700 "$ROOTFS/home/vagrant/.ssh"
  install -m 0600 "$VAGRANT_PUB" "$ROOTFS/home/vagrant/.ssh/authorized_keys"
  in_root chown -R vagrant:vagrant /home/vagrant/.ssh
  printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' >"$ROOTFS/etc/sudoers.d/vagrant"
  chmod 0440 "$ROOTFS/etc/sudoers.d/vagrant"

  # identity made at first boot: empty machine-id (systemd fills it), no dbus copy
  : >"$ROOTFS/etc/machine-id"
  rm -f "$ROOTFS/var/lib/dbus/machine-id"
  in_root apt-get clean
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/*

  KERNEL=$(ls "$ROOTFS"/boot/vmlinuz-* | sort -V | tail -n1)
  INITRD=$ROOTFS/boot/initrd.img-${KERNEL##*/vmlinuz-}
  [ -f "$INITRD" ] || die "no initrd beside $KERNEL"
  cleanup; mounted=()

  log "making the disk image"
  OUT=$BUILD/out
  rm -rf "$OUT"; mkdir -p "$OUT"
  truncate -s 4G "$OUT/root.raw"
  mkfs.ext4 -q -L root -d "$ROOTFS" "$OUT/root.raw"
  qemu-img convert -O qcow2 "$OUT/root.raw" "$OUT/box.img"
  rm -f "$OUT/root.raw"
  cp "$KERNEL" "$OUT/vmlinuz"
  cp "$INITRD" "$OUT/initrd.img"
  chmod 0644 "$OUT/vmlinuz" "$OUT/initrd.img" "$OUT/box.img"
  echo '{"provider": "libvirt", "format": "qcow2", "virtual_size": 4}' >"$OUT/metadata.json"
  cp "$HERE/box/Vagrantfile" "$OUT/Vagrantfile"
  rm -f "$BOXDIR"/netlimit-debian12-*.box
  tar -C "$OUT" -cf "$BOXFILE.partial" metadata.json Vagrantfile box.img vmlinuz initrd.img
  mv "$BOXFILE.partial" "$BOXFILE"
  rm -rf "$OUT"
  rm -rf --one-file-system "$ROOTFS"      # the pristine stage stays; the configured copy is in the box
  log "box $BOXFILE ($(du -h "$BOXFILE" | cut -f1)) built in $(( $(date +%s) - t0 )) s"
fi

# A one-version catalog, so the box carries a version (libvirt's cached volume
# is named after it: a rebuilt box never reuses a stale volume).
cat >"$CATALOG" <<JSON
{"name": "$NETLIMIT_BOX_NAME",
 "versions": [{"version": "$VERSION",
               "providers": [{"name": "libvirt", "url": "file://$BOXFILE",
                              "checksum_type": "sha256", "checksum": "$(sha256sum "$BOXFILE" | cut -d' ' -f1)"}]}]}
JSON
log "vagrant box add $NETLIMIT_BOX_NAME $VERSION (VAGRANT_HOME=$VAGRANT_HOME)"
vagrant box add --force --provider libvirt "$CATALOG" 2>&1 | tr '\r' '\n' | { grep -v 'Progress:' || true; } >&2
# older versions of this box are dead weight
vagrant box list --machine-readable 2>/dev/null | awk -F, -v n="$NETLIMIT_BOX_NAME" '
  $3=="box-name" {name=$4} $3=="box-version" && name==n {print $4}' | while read -r v; do
  [ "$v" = "$VERSION" ] || vagrant box remove --force "$NETLIMIT_BOX_NAME" --box-version "$v" >&2 || true
done
echo "$VERSION"

# Shared settings of build-box.sh and run.sh (sourced, not run).
# Everything cached lives outside the repository; override with the environment.
NETLIMIT_VAGRANT_CACHE=${NETLIMIT_VAGRANT_CACHE:-/var/cache/netlimit-vagrant}
# Vagrant's own state (added boxes) under the cache too: the box carries the kernel
# and initrd that QEMU (user libvirt-qemu) must read, and /root is not traversable.
export VAGRANT_HOME=${VAGRANT_HOME:-$NETLIMIT_VAGRANT_CACHE/vagrant.d}
NETLIMIT_BOX_NAME=${NETLIMIT_BOX_NAME:-netlimit/debian12}
NETLIMIT_BOX_SUITE=bookworm

# The first Debian archive URI for $NETLIMIT_BOX_SUITE in this machine's apt sources
# (deb822 *.sources or one-line *.list): the box is built from what apt already uses.
apt_mirror() {
  python3 - "$NETLIMIT_BOX_SUITE" <<'PY'
import re, sys
from pathlib import Path
suite = sys.argv[1]
found = []
for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
    for block in f.read_text().split("\n\n"):
        uris = re.search(r"^URIs:\s*(.+)$", block, re.M)
        suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
        types = re.search(r"^Types:\s*(.+)$", block, re.M)
        enabled = re.search(r"^Enabled:\s*no", block, re.M | re.I)
        if uris and suites and suite in suites.group(1).split() and not enabled \
                and (types is None or "deb" in types.group(1).split()):
            found += uris.group(1).split()
for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
    if f.exists():
        for line in f.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if m and m.group(2) == suite:
                found.append(m.group(1))
if not found:
    sys.exit(f"no apt source for {suite} in /etc/apt: cannot debootstrap the box")
print(found[0])
PY
}

# Hash of everything the box is made from: a changed recipe means a new box version.
box_recipe_hash() {
  cat "$(dirname "${BASH_SOURCE[0]}")/build-box.sh" "$(dirname "${BASH_SOURCE[0]}")/box/"* | sha256sum | cut -c1-10
}

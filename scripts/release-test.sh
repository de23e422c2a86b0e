#!/usr/bin/env bash
# Build the release from a clean checkout (scripts/release.sh) and install every artifact
# for real, as root. Too long for .ci/run (about 25 minutes on 2 cores, most of it the
# .deb's venv and lintian), so it is the release gate, run before tagging:
#   1. scripts/release.sh                      wheel, sdist, .deb (+ lintian), image, SHA256SUMS
#   2. pipx install of the wheel + `netlimit demo` from it (pipx from Debian's package)
#   3. tests/release/release_deb.py            the .deb in a clean Debian 12 under systemd-nspawn:
#                                              install, enforce, reload, upgrade without a gap,
#                                              remove, purge
#   4. tests/release/release_image.py          the sidecar image under podman: burst -> 429,
#                                              healthcheck, non-root, read-only, stop < 2 s
# Set SKIP_BUILD=1 to test what dist/ already holds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
[ "$(id -u)" = 0 ] || { echo "release-test.sh: run as root" >&2; exit 64; }
declare -A T
timed() { local name=$1; shift; local s; s=$(date +%s); "$@"; T[$name]=$(( $(date +%s) - s )); }

if [ -z "${SKIP_BUILD:-}" ]; then
  timed release bash scripts/release.sh
fi
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' netlimit/__init__.py)
(cd dist && sha256sum -c --quiet SHA256SUMS)

pipx_check() {
  # only the wheel: a PYTHONPATH inherited from a checkout would run its netlimit instead
  unset PYTHONPATH
  local home; home=$(mktemp -d /tmp/netlimit-pipx.XXXXXX)
  PIPX_HOME=$home PIPX_BIN_DIR=$home/bin pipx install --python /usr/bin/python3 "dist/netlimit-$VERSION-py3-none-any.whl" >/dev/null
  "$home/bin/netlimit" --version
  du -sm "$home/venvs/netlimit" | awk '{print "pipx venv: " $1 " MB"}'
  local rc=0
  (cd /tmp && timeout 300 "$home/bin/netlimit" demo) || rc=$?
  rm -rf "$home"
  return $rc
}
timed pipx pipx_check
timed deb env NETLIMIT_DEB="dist/netlimit_${VERSION}_amd64.deb" "$PY" -m pytest -q -s -p no:cacheprovider tests/release/release_deb.py
timed image env NETLIMIT_IMAGE="dist/netlimit-sidecar-$VERSION.image.tar" "$PY" -m pytest -q -s -p no:cacheprovider tests/release/release_image.py
echo "release-test.sh: all passed; timings (s): release ${T[release]:--} | pipx+demo ${T[pipx]} | deb ${T[deb]} | image ${T[image]}"
ls -l dist/

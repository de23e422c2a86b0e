#!/usr/bin/env bash
# Wheels for the offline limiter VM: the checkout's netlimit wheel plus every
# dependency, for the box's Python (Debian 12: CPython 3.11.2, x86_64, glibc
# 2.36) — built with this machine's Debian python3, which is that same Python.
#
#   vagrant/wheels.sh      # prints the directory (also linked as $CACHE/wheels/current)
#
# Dependency wheels are cached by the dependency list (pyproject.toml), so
# after the first run only the netlimit wheel is rebuilt, offline: the build
# venv already holds setuptools and wheel (no build isolation download).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
# shellcheck source=vagrant/common.sh
. "$HERE/common.sh"
CACHE=$NETLIMIT_VAGRANT_CACHE
PY=${NETLIMIT_BOX_PYTHON:-/usr/bin/python3}
log() { echo "wheels: $*" >&2; }

"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  log "$PY is $("$PY" -V 2>&1); the box runs Python 3.11 (set NETLIMIT_BOX_PYTHON to a 3.11)"; exit 64; }
mkdir -p "$CACHE/wheels"
exec 8>"$CACHE/wheels/.lock"
flock 8

VENV=$CACHE/build-venv
if [ ! -x "$VENV/bin/pip" ]; then
  log "build venv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
fi

# the dependency list; Debian 12's Python is 3.11.2, below 3.11.3, so redis
# also needs async-timeout (pip resolves that marker for the Python it runs on)
DEPS=$("$VENV/bin/python" - "$REPO/pyproject.toml" <<'PY'
import sys, tomllib
meta = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(meta["project"]["dependencies"]))
PY
)
KEY=$( (echo "$DEPS"; "$PY" -V) | sha256sum | cut -c1-12)
DEPDIR=$CACHE/wheels/deps-$KEY
if [ ! -f "$DEPDIR/.complete" ]; then
  log "dependency wheels -> $DEPDIR (needs PyPI once)"
  rm -rf "$DEPDIR"; mkdir -p "$DEPDIR"
  mapfile -t dep_array <<<"$DEPS"
  "$VENV/bin/pip" wheel -q -w "$DEPDIR" "${dep_array[@]}"
  touch "$DEPDIR/.complete"
fi

OUT=$CACHE/wheels/run-$KEY
rm -rf "$OUT"; mkdir -p "$OUT"
cp "$DEPDIR"/*.whl "$OUT/"
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
# build from a copy of the tracked and modified files: no stale build/ or egg-info leaks in
mkdir -p "$BUILD/src"
if command -v git >/dev/null && git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$REPO" ls-files -z --cached --others --exclude-standard \
    | tar -C "$REPO" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$BUILD/src" -xf -
else   # not a git checkout: everything but build products and VM state
  tar -C "$REPO" --exclude=.git --exclude=build --exclude=dist --exclude='*.egg-info' --exclude=.venv \
    --exclude=.vagrant -cf - . | tar -C "$BUILD/src" -xf -
fi
# the XDP object is a build product (not in git): compiled here with the host's clang, so
# the wheel ships it and the VM needs only libbpf1 (docs/xdp.md, Requirements)
(cd "$BUILD/src" && "$PY" -m netlimit.kernel.xdp.build --force >/dev/null) || {
  log "cannot build netlimit/kernel/xdp/netlimit_xdp.o (apt-get install clang llvm libbpf-dev)"; exit 1; }
"$VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OUT" "$BUILD/src"
ls "$OUT"/netlimit-*.whl >/dev/null
"$PY" - "$OUT"/netlimit-*.whl <<'PY' || { log "the wheel lacks the XDP object"; exit 1; }
import sys, zipfile
sys.exit(0 if "netlimit/kernel/xdp/netlimit_xdp.o" in zipfile.ZipFile(sys.argv[1]).namelist() else 1)
PY
ln -sfn "$OUT" "$CACHE/wheels/current"
# wheels of an older dependency list are dead weight
find "$CACHE/wheels" -mindepth 1 -maxdepth 1 -type d \( -name 'deps-*' -o -name 'run-*' \) \
  ! -name "deps-$KEY" ! -name "run-$KEY" -exec rm -rf {} +
log "$(ls "$OUT" | wc -l) wheels in $OUT"
echo "$OUT"

#!/usr/bin/env bash
# Build every release artifact of netlimit from a clean checkout of HEAD into dist/:
#   netlimit-VERSION-py3-none-any.whl, netlimit-VERSION.tar.gz   (python3 -m build)
#   netlimit-VERSION-cp311-cp311-linux_x86_64.whl              (NETLIMIT_MYPYC=1: the compiled door,
#                                                                netlimit/compiled.py; pip prefers it)
#   netlimit_VERSION_amd64.deb                                   (scripts/build-deb.sh: debhelper + dh-virtualenv)
#   netlimit-sidecar-VERSION.image.tar                           (scripts/build-image.sh: debootstrap + buildah)
#   SHA256SUMS                                                   (sha256sum of all the above)
# Uncommitted changes are not in the release: it builds what `git clone` of HEAD gives.
#
#   bash scripts/release.sh                  # everything (root: the .deb and the image need it)
#   ARTIFACTS="python" bash scripts/release.sh   # only the wheel and the sdist (no root)
#   ARTIFACTS="python deb" ...               # any of: python deb image
#
# The version is netlimit/__init__.py's __version__; SOURCE_DATE_EPOCH is the commit's
# time, so the archives' timestamps do not depend on when the script ran.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARTIFACTS=${ARTIFACTS:-python deb image}
PY=/usr/bin/python3   # Debian's Python: the .deb's venv and the image use it too

need() { command -v "$1" >/dev/null || { echo "release.sh: $1 is missing (apt-get install $2)" >&2; exit 64; }; }
need git git
"$PY" -c 'import build' 2>/dev/null || { echo "release.sh: python3 -m build is missing (apt-get install python3-build)" >&2; exit 64; }

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' netlimit/__init__.py)
[ -n "$VERSION" ] || { echo "release.sh: no __version__ in netlimit/__init__.py" >&2; exit 1; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release.sh: note: the work tree has uncommitted changes; the release is built from HEAD without them" >&2
fi

work=$(mktemp -d /tmp/netlimit-release.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
git clone -q --no-hardlinks "$ROOT" "$work/src"
SOURCE_DATE_EPOCH=$(git -C "$work/src" log -1 --format=%ct)
export SOURCE_DATE_EPOCH
out="$work/dist"
mkdir -p "$out"
t0=$(date +%s)
echo "release.sh: netlimit $VERSION from $(git -C "$work/src" rev-parse --short HEAD)"

case " $ARTIFACTS " in *" python "*)
  s=$(date +%s)
  (cd "$work/src" && "$PY" -m build --outdir "$out" . >"$work/build.log" 2>&1) \
    || { tail -30 "$work/build.log" >&2; echo "release.sh: python -m build failed" >&2; exit 1; }
  (cd "$work/src" && NETLIMIT_MYPYC=1 "$PY" -m build --wheel --outdir "$out" . >"$work/build.log" 2>&1) \
    || { tail -30 "$work/build.log" >&2; echo "release.sh: the compiled wheel failed (gcc, python3-dev?)" >&2; exit 1; }
  echo "release.sh: wheels and sdist in $(( $(date +%s) - s )) s"
esac
case " $ARTIFACTS " in *" deb "*)
  s=$(date +%s)
  bash "$work/src/scripts/build-deb.sh" "$work/src" "$out"
  echo "release.sh: .deb in $(( $(date +%s) - s )) s"
esac
case " $ARTIFACTS " in *" image "*)
  s=$(date +%s)
  # the image runs the compiled door (Debian's python3 is the one the wheel is built for)
  whl=$(ls "$out"/netlimit-"$VERSION"-cp3*-linux_*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    (cd "$work/src" && NETLIMIT_MYPYC=1 "$PY" -m build --wheel --outdir "$work/whl" . >"$work/build.log" 2>&1) \
      || { tail -30 "$work/build.log" >&2; echo "release.sh: the compiled wheel failed" >&2; exit 1; }
    cp "$work"/whl/*.whl "$out/"
    whl=$(ls "$out"/netlimit-"$VERSION"-cp3*-linux_*.whl | head -1)
  fi
  bash "$work/src/scripts/build-image.sh" "$whl" "$out"
  echo "release.sh: image in $(( $(date +%s) - s )) s"
esac

(cd "$out" && sha256sum -- * >SHA256SUMS)
rm -rf "$ROOT/dist"   # dist/ holds one release: no file of an earlier build beside SHA256SUMS
mkdir -p "$ROOT/dist"
for f in "$out"/*; do
  cp -f "$f" "$ROOT/dist/"
done
echo "release.sh: dist/ after $(( $(date +%s) - t0 )) s:"
(cd "$ROOT/dist" && for f in $(cut -d' ' -f3- SHA256SUMS) SHA256SUMS; do printf '  %-44s %8s KB\n' "$f" "$(( $(stat -c %s "$f") / 1024 ))"; done)

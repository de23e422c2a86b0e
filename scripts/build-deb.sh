#!/usr/bin/env bash
# Build netlimit_VERSION_amd64.deb with Debian's tooling (debhelper + dh-virtualenv, see
# debian/), then lint it. Called by scripts/release.sh; alone:
#   bash scripts/build-deb.sh [SRC_DIR] [OUT_DIR]        (defaults: this checkout, dist/)
# SRC_DIR's tracked and untracked-but-not-ignored files are copied to a scratch directory
# first, so the checkout never gets debian/netlimit/ or build/ in it.
# DEB_VERSION=X overrides the package version (a changelog entry is added in the copy):
# the upgrade test builds a "later" package that way.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
SRC=$(cd "${1:-$HERE}" && pwd)
OUT=${2:-$HERE/dist}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for tool in dpkg-buildpackage dh dh_virtualenv lintian; do
  command -v "$tool" >/dev/null || { echo "build-deb.sh: $tool is missing (apt-get install debhelper dh-virtualenv lintian)" >&2; exit 64; }
done

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$SRC/netlimit/__init__.py")
DEB_CHANGELOG_VERSION=$(sed -n '1s/^netlimit (\([^)]*\)).*/\1/p' "$SRC/debian/changelog")
if [ -z "${DEB_VERSION:-}" ] && [ "$DEB_CHANGELOG_VERSION" != "$VERSION" ]; then
  echo "build-deb.sh: debian/changelog says $DEB_CHANGELOG_VERSION, netlimit/__init__.py $VERSION: add a changelog entry" >&2
  exit 1
fi

scratch=$(mktemp -d /tmp/netlimit-deb.XXXXXX)
# kept on failure, for its build.log, lintian.log and .deb
trap 'rc=$?; if [ $rc = 0 ]; then rm -rf "$scratch"; else echo "build-deb.sh: kept $scratch" >&2; fi' EXIT
mkdir "$scratch/netlimit-$VERSION"
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --no-recursion 2>/dev/null) \
  | tar -xf - -C "$scratch/netlimit-$VERSION"
cd "$scratch/netlimit-$VERSION"
if [ -n "${DEB_VERSION:-}" ]; then
  { printf 'netlimit (%s) bookworm; urgency=medium\n\n  * Rebuild.\n\n -- netlimit maintainers <netlimit@example.org>  %s\n\n' \
      "$DEB_VERSION" "$(date -R -u ${SOURCE_DATE_EPOCH:+-d @$SOURCE_DATE_EPOCH})"; cat debian/changelog; } >debian/changelog.new
  mv debian/changelog.new debian/changelog
fi
: "${SOURCE_DATE_EPOCH:=$(git -C "$SRC" log -1 --format=%ct 2>/dev/null || date +%s)}"
export SOURCE_DATE_EPOCH
start=$(date +%s)
if ! dpkg-buildpackage -us -uc -b >"$scratch/build.log" 2>&1; then
  tail -40 "$scratch/build.log" >&2
  echo "build-deb.sh: dpkg-buildpackage failed (log above)" >&2
  exit 1
fi
deb=$(ls "$scratch"/netlimit_*_amd64.deb)
echo "build-deb.sh: built $(basename "$deb") in $(( $(date +%s) - start )) s ($(( $(stat -c %s "$deb") / 1024 / 1024 )) MB)"
# lintian: errors fail the build; the tags a bundled venv raises by design are in
# debian/netlimit.lintian-overrides with the reason
if ! lintian --fail-on error "$deb" >"$scratch/lintian.log" 2>&1; then
  grep -v '^[WIPN]:' "$scratch/lintian.log" >&2
  echo "build-deb.sh: lintian found errors" >&2
  exit 1
fi
echo "build-deb.sh: lintian: $(grep -c '^E:' "$scratch/lintian.log" || true) errors, $(grep -c '^W:' "$scratch/lintian.log" || true) warnings"
cp "$deb" "$OUT/"

#!/usr/bin/env bash
# Build the OCI image of the HTTP sidecar from a debootstrap root of Debian 12 with buildah
# (no base image is pulled): Debian's python3, a venv with the core wheel, user netlimit
# (uid 10001), image/entrypoint.sh, a HEALTHCHECK on /healthz. Called by scripts/release.sh:
#   bash scripts/build-image.sh WHEEL [OUT_DIR]     -> OUT_DIR/netlimit-sidecar-VERSION.image.tar
# The archive is `podman save --format docker-archive` (docker format keeps the HEALTHCHECK,
# which the OCI format has no field for); podman and docker load it. Root needed.
# The debootstrap base is cached in $NETLIMIT_RELEASE_CACHE (/var/cache/netlimit-release).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WHEEL=$(realpath "${1:?usage: build-image.sh WHEEL [OUT_DIR]}")
OUT=${2:-$HERE/dist}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE=${NETLIMIT_RELEASE_CACHE:-/var/cache/netlimit-release}
for tool in debootstrap buildah podman; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is missing (apt-get install debootstrap buildah podman)" >&2; exit 64; }
done
VERSION=$(basename "$WHEEL" | sed -n 's/^netlimit-\([^-]*\)-.*/\1/p')
IMAGE=localhost/netlimit-sidecar:$VERSION
MIRROR=$(PYTHONPATH="$HERE/tests/helpers" python3 -c 'import rootfs; print(rootfs.apt_mirror())')
start=$(date +%s)

# --- the base: Debian 12 minbase + python3, cached (about 3 minutes once)
base="$CACHE/image-base-bookworm"
mkdir -p "$CACHE"
if [ ! -f "$base/.done" ]; then
  rm -rf "$base"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$base" "$MIRROR" >"$CACHE/image-base.log" 2>&1 \
    || { tail -20 "$CACHE/image-base.log" >&2; exit 1; }
  touch "$base/.done"
fi

scratch=$(mktemp -d /tmp/netlimit-image.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
root="$scratch/root"
cp -a "$base" "$root"
rm -f "$root/.done"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# the wheels are fetched on the host (its pip configuration and network); the chroot
# installs them offline. Debian 12's Python is 3.11.2: redis-py needs async-timeout there.
python3 -m pip wheel -q -w "$root/tmp/wheels" "$WHEEL" "async-timeout>=4.0.3" >"$scratch/pip.log" 2>&1 \
  || { tail -20 "$scratch/pip.log" >&2; exit 1; }
chroot "$root" python3 -m venv /opt/netlimit
chroot "$root" /opt/netlimit/bin/pip install -q --no-compile --disable-pip-version-check --no-index \
  --find-links /tmp/wheels netlimit async-timeout >>"$scratch/pip.log" 2>&1 || { tail -20 "$scratch/pip.log" >&2; exit 1; }
chroot "$root" useradd --uid 10001 --user-group --home-dir /nonexistent --no-create-home \
  --shell /usr/sbin/nologin netlimit
install -D -m 0755 "$HERE/image/entrypoint.sh" "$root/usr/local/bin/netlimit-sidecar"
install -D -m 0644 "$HERE/image/healthcheck.py" "$root/usr/local/lib/netlimit-healthcheck.py"
install -D -m 0644 "$HERE/image/netlimit.yaml" "$root/etc/netlimit/netlimit.yaml"

# --- what a sidecar never uses at run time (the image is rebuilt, never upgraded in place)
site=$(echo "$root"/opt/netlimit/lib/python3*/site-packages)
rm -rf "$site"/pip "$site"/pip-* "$site"/setuptools "$site"/setuptools-* "$site"/_distutils_hack \
  "$site"/distutils-precedence.pth "$site"/pkg_resources "$root"/opt/netlimit/bin/pip* "$root"/opt/netlimit/bin/activate* \
  "$root"/opt/netlimit/bin/Activate.ps1
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/usr/share/lintian "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
  "$root"/var/log/* "$root"/tmp/* "$root"/usr/lib/python3.11/test "$root"/usr/lib/python3.11/idlelib \
  "$root"/usr/lib/python3.11/tkinter "$root"/usr/lib/python3.11/ensurepip "$root"/usr/lib/python3.11/lib2to3 \
  "$root"/usr/share/python-wheels "$root"/etc/resolv.conf
# perl (only dpkg's maintainer scripts use it), iconv modules, apt, pydoc's data: the image
# runs one Python program and is replaced, never upgraded in place (/var/lib/dpkg/status
# stays, for image scanners)
rm -rf "$root"/usr/bin/perl* "$root"/usr/lib/x86_64-linux-gnu/perl-base "$root"/usr/share/perl5 \
  "$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/usr/bin/apt* "$root"/usr/lib/apt "$root"/usr/lib/x86_64-linux-gnu/libapt-* \
  "$root"/usr/lib/python3.11/pydoc_data "$root"/var/lib/dpkg/info/*.md5sums
# the wheels' extension modules carry their symbol tables (uvloop's is 13 MB unstripped)
find "$root/opt/netlimit" -name '*.so*' -type f -exec strip --strip-unneeded {} +
find "$root" -name __pycache__ -type d -prune -exec rm -rf {} +
# bytecode once, at build time (the root file system is read-only at run time)
chroot "$root" /opt/netlimit/bin/python -m compileall -q -j 0 /opt/netlimit/lib /usr/lib/python3.11 >/dev/null 2>&1 || true
: >"$root/etc/machine-id"

# --- the image
ctr=$(buildah from scratch)
cleanup_ctr() { buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$scratch"; }
trap cleanup_ctr EXIT
tar -C "$root" --numeric-owner -cf "$scratch/root.tar" .
buildah add "$ctr" "$scratch/root.tar" / >/dev/null   # a tar archive is unpacked into the image
buildah config \
  --user 10001:10001 \
  --workingdir / \
  --entrypoint '["/usr/local/bin/netlimit-sidecar"]' \
  --cmd '[]' \
  --env PATH=/opt/netlimit/bin:/usr/local/bin:/usr/bin:/bin \
  --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 \
  --port 8080 \
  --stop-signal SIGTERM \
  --healthcheck 'CMD-SHELL /opt/netlimit/bin/python /usr/local/lib/netlimit-healthcheck.py' \
  --healthcheck-interval 10s --healthcheck-timeout 3s --healthcheck-start-period 5s --healthcheck-retries 3 \
  --label org.opencontainers.image.title=netlimit-sidecar \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.description="netlimit's HTTP rate-limit sidecar (reverse proxy, nginx auth_request, Envoy ext_authz, JSON)" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  "$ctr"
buildah commit --format docker --rm -q "$ctr" "$IMAGE" >/dev/null
trap 'rm -rf "$scratch"' EXIT
archive="$OUT/netlimit-sidecar-$VERSION.image.tar"
rm -f "$archive"
podman save --format docker-archive -o "$archive" "$IMAGE" 2>/dev/null
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build-image.sh: $IMAGE, $(( size / 1000 / 1000 )) MB, $(basename "$archive") in $(( $(date +%s) - start )) s"

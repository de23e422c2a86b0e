#!/bin/sh
# The sidecar image's entry point: `netlimit sidecar` with its settings from the
# environment (every one optional), exec'd so the sidecar is PID 1 and gets SIGTERM.
#   NETLIMIT_CONFIG        the rules file (default /etc/netlimit/netlimit.yaml: mount yours there)
#   NETLIMIT_LISTEN        client-facing HOST:PORT (default 0.0.0.0:8080)
#   NETLIMIT_UPSTREAM      http://HOST:PORT of the application: reverse-proxy mode
#                          (without it: the decision endpoints for nginx/Envoy)
#   NETLIMIT_ADMIN_LISTEN  decision/operator endpoints, /healthz (default 127.0.0.1:8182,
#                          what the HEALTHCHECK asks; publish it with care)
#   NETLIMIT_REDIS         redis://, redis+cluster://, redis+sentinel:// … (default: the file's storage)
#   NETLIMIT_SIDECAR_ARGS  any other flags of `netlimit sidecar --help`
set -eu
set -- --config "${NETLIMIT_CONFIG:-/etc/netlimit/netlimit.yaml}" \
       --listen "${NETLIMIT_LISTEN:-0.0.0.0:8080}" \
       --admin-listen "${NETLIMIT_ADMIN_LISTEN:-127.0.0.1:8182}" "$@"
if [ -n "${NETLIMIT_UPSTREAM:-}" ]; then set -- "$@" --upstream "$NETLIMIT_UPSTREAM"; fi
if [ -n "${NETLIMIT_REDIS:-}" ]; then set -- "$@" --redis "$NETLIMIT_REDIS"; fi
# shellcheck disable=SC2086  # word splitting of the extra flags is the point
exec /opt/netlimit/bin/netlimit sidecar "$@" ${NETLIMIT_SIDECAR_ARGS:-}

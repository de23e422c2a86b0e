#!/usr/bin/env bash
# The HTTP Garden's request-smuggling and desync payloads (narfindustries/http-garden,
# TROPHIES.md) through tests/sidecar/test_differential.py: each must reach the
# application behind the sidecar as it reaches the one behind nginx, or be refused.
# The Garden is GPL-3.0, so netlimit does not ship its file; this fetches it (or takes
# a copy you name) and runs the comparison. As root, from the repository:
#
#   bash scripts/http_garden.sh [PATH-TO-TROPHIES.md]
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT=ffb9164c6603f6201c1dc70afb08fd229e2778bc  # the commit these were last run at
file=${1:-}
if [ -z "$file" ]; then
  file=$(mktemp --suffix=-TROPHIES.md)
  trap 'rm -f "$file"' EXIT
  curl -fsSL "https://raw.githubusercontent.com/narfindustries/http-garden/$COMMIT/TROPHIES.md" -o "$file"
fi
NETLIMIT_HTTP_GARDEN="$file" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/sidecar/test_differential.py -k test_http_garden_payloads

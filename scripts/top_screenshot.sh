#!/usr/bin/env bash
# README's picture of `netlimit top` (docs/top.svg): the tmux test of tests/monitoring
# runs a daemon in a namespace it creates, a sidecar and bounded traffic, and saves the
# live screen it checked as an SVG. Run as root from the repository: bash scripts/top_screenshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NETLIMIT_TOP_SVG="$PWD/docs/top.svg" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/monitoring/test_top.py -k test_top_on_a_terminal_shows_live_rates_and_quits_on_q
echo "wrote docs/top.svg"

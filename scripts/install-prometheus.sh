#!/usr/bin/env bash
# Debian's prometheus and promtool (docs/operations.md, "On call"): the tests check the chart's
# alert rules with promtool and scrape a running stack with a real Prometheus. The package starts
# no daemon here (no systemd); tests run their own on a free port. Idempotent.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi
echo "installing prometheus and promtool (apt)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; } \
  || { echo "prometheus is missing and apt could not install it" >&2; exit 1; }
prometheus --version 2>&1 | sed -n 1p

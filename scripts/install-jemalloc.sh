#!/usr/bin/env bash
# Debian's jemalloc, the malloc the training image runs (docker/model.Dockerfile): the training
# memory tests measure ranks under it, as they run in production.
set -euo pipefail
if ldconfig -p | grep -q 'libjemalloc\.so\.2'; then exit 0; fi
echo "installing libjemalloc2 (apt)"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q libjemalloc2 >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libjemalloc2 >/dev/null; } \
  || { echo "libjemalloc2 is missing and apt could not install it" >&2; exit 1; }

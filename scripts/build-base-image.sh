#!/usr/bin/env bash
# Builds a Python 3.11 base image from Debian's archive, for machines that reach apt but no image
# registry: debootstrap a minimal bookworm with python3, import it into the local engine.
# The images build FROM it exactly as FROM python:3.11-slim-bookworm (python, venv, pip via
# ensurepip, ca-certificates, useradd). Usage: scripts/build-base-image.sh [IMAGE]
# MIRROR overrides the Debian mirror (default: the first one apt uses here).
set -euo pipefail
IMAGE=${1:-gearshift-base:bookworm-py311}
SUITE=bookworm
# The mirror apt already uses for Debian itself (not -security, not third-party repositories).
MIRROR=${MIRROR:-$(grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -1 | tr -d ' ' || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
if ! command -v debootstrap >/dev/null; then  # a fresh CI machine has apt but not debootstrap
  echo "installing debootstrap (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; } \
    || { echo "debootstrap is missing and apt could not install it" >&2; exit 1; }
fi

ROOT=$(mktemp -d /tmp/gearshift-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "debootstrap $SUITE from $MIRROR into $ROOT"
# python3-venv brings ensurepip (the slim image's pip); python-is-python3 gives `python`.
debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
  "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log" >&2; exit 1; }
rm -f "$ROOT.log"
# Nothing downloaded needs to stay in the image.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/*
tar --numeric-owner -C "$ROOT" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
echo "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"

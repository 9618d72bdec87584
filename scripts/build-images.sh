#!/usr/bin/env bash
# Builds every image the chart and skaffold.yaml use, one at a time, tagged as the chart refers
# to them (gearshift-<name>:<chart appVersion>), and prints their sizes.
#   BASE=auto    the pinned python slim image when it is here or can be pulled, else a base
#                built from Debian packages (scripts/build-base-image.sh); BASE=local forces
#                that; any other value is used as the base image itself.
#   TAG          the tag (default: the chart's appVersion).
#   TEST_DEPS=1  also gearshift-test-deps (Postgres and Redis from Debian, for make test-images).
#   CUDA=1       also gearshift-training-cuda, the training image with PyPI's CUDA torch that
#                values-gpu.yaml names (downloads GBs; never built by default, nor by CI).
# The host's extra CA certificates (/usr/local/share/ca-certificates) go in as EXTRA_CA_CERTS, and
# a local torch CPU wheel from pip's find-links into docker/wheels/ (no CUDA download unless CUDA=1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON_SLIM=python:3.11.7-slim-bookworm
LOCAL_BASE=gearshift-base:bookworm-py311
BASE=${BASE:-auto}
TAG=${TAG:-$(sed -nE 's/^appVersion: *"?([^"]+)"?/\1/p' charts/gearshift/Chart.yaml)}
TORCH_VERSION=2.13.0
export DOCKER_BUILDKIT=0  # the engine's classic builder: needs no buildx plugin and no frontend image

docker info >/dev/null 2>&1 || { echo "no container engine answers (docker info); scripts/docker-engine.sh starts one" >&2; exit 1; }

case "$BASE" in
  auto)
    if docker image inspect "$PYTHON_SLIM" >/dev/null 2>&1 || timeout 60 docker pull -q "$PYTHON_SLIM" >/dev/null 2>&1; then
      BASE=$PYTHON_SLIM
    else
      echo "no registry reachable for $PYTHON_SLIM: using a base built from Debian packages"
      BASE=local
    fi ;;
esac
if [[ "$BASE" == local ]]; then
  BASE=$LOCAL_BASE
  docker image inspect "$BASE" >/dev/null 2>&1 || scripts/build-base-image.sh "$BASE"
fi

# Extra CA certificates: what update-ca-certificates adds on this machine.
EXTRA_CA_CERTS=$(find /usr/local/share/ca-certificates -name '*.crt' -type f 2>/dev/null | sort | xargs -r cat)

# The local torch CPU wheel, from pip's find-links folders (hard-linked when on the same disk).
rm -f docker/wheels/torch-*.whl
links="${PIP_FIND_LINKS:-} $(pip config get global.find-links 2>/dev/null || true)"
for dir in $links; do
  dir=${dir#file://}
  for wheel in "$dir"/torch-"$TORCH_VERSION"+cpu-*.whl; do
    [[ -f "$wheel" ]] && { ln -f "$wheel" docker/wheels/ 2>/dev/null || cp "$wheel" docker/wheels/; break 2; }
  done
done
ls docker/wheels/torch-*.whl >/dev/null 2>&1 || echo "no local torch $TORCH_VERSION CPU wheel: the model images download it from TORCH_INDEX_URL"

build() {  # build NAME DOCKERFILE TARGET [BUILD ARGS...]
  local name=$1 file=$2 target=$3 started=$SECONDS
  shift 3
  echo "== gearshift-$name:$TAG"
  local log="${TMPDIR:-/tmp}/gearshift-build-$name.log"
  if ! docker build -f "$file" ${target:+--target "$target"} -t "gearshift-$name:$TAG" \
      --build-arg PYTHON_IMAGE="$BASE" --build-arg EXTRA_CA_CERTS="$EXTRA_CA_CERTS" "$@" . >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "building gearshift-$name failed (whole log: $log)" >&2
    exit 1
  fi
  echo "   built in $((SECONDS - started)) s"
}

started=$SECONDS
for service in router planner executor sandbox reward store gateway; do
  build "$service" docker/service.Dockerfile service --build-arg SERVICE="$service"
done
build worker docker/service.Dockerfile worker
build policy-server docker/model.Dockerfile policy-server
build training docker/model.Dockerfile training
if [[ "${CUDA:-0}" == 1 ]]; then
  # The Dockerfile installs a wheel from docker/wheels/ when one is there, and that one is CPU torch.
  rm -f docker/wheels/torch-*.whl
  build training-cuda docker/model.Dockerfile training --build-arg TORCH_INDEX_URL=https://pypi.org/simple
fi
if [[ "${TEST_DEPS:-0}" == 1 ]]; then
  build test-deps docker/testing/deps.Dockerfile ""
fi
echo "all images built in $((SECONDS - started)) s from $BASE"
docker image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E "^gearshift-.*:$TAG" | sort | column -t

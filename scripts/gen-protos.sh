#!/usr/bin/env bash
# Regenerates the Python gRPC code from protos/ into libs/gearshift/<service>/v1/.
# CI runs it and fails when the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
mapfile -t files < <(cd protos && find gearshift -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -I protos --python_out=libs --pyi_out=libs --grpc_python_out=libs "${files[@]}"
# Make every generated folder a regular package so it installs like the rest of gearshift.
for f in "${files[@]}"; do
  d=libs/$(dirname "$f")
  while [ "$d" != libs/gearshift ]; do touch "$d/__init__.py"; d=$(dirname "$d"); done
done

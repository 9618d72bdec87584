#!/usr/bin/env bash
# Regenerates the Python gRPC code from protos/gearshift/<service>/v1/ into
# libs/gearshift/api/<service>/v1/ (as temporalio keeps its generated code under temporalio.api).
# protoc writes imports that follow the proto paths (gearshift.<service>.v1); they are rewritten
# to gearshift.api.<service>.v1. Proto package names are unchanged, so nothing changes on the wire.
# CI runs this and fails when the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=libs/gearshift/api
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t files < <(cd protos && find gearshift -name '*.proto' | sort)
"$PY" -m grpc_tools.protoc -I protos --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" "${files[@]}"
find "$tmp/gearshift" -type f -exec sed -i -E \
  -e 's/^(from|import) gearshift\.([a-z_]+)\.v1/\1 gearshift.api.\2.v1/' \
  -e "s/BuildTopDescriptorsAndMessages\(DESCRIPTOR, 'gearshift\./BuildTopDescriptorsAndMessages(DESCRIPTOR, 'gearshift.api./" {} +
rm -rf "$out"/*/v1
mkdir -p "$out"
cp -r "$tmp"/gearshift/* "$out"/
# Every generated folder is a regular package, so it installs like the rest of gearshift.
for f in "${files[@]}"; do
  d=$out/$(dirname "${f#gearshift/}")
  while [ "$d" != "$out" ]; do touch "$d/__init__.py"; d=$(dirname "$d"); done
done
